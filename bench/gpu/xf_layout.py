#!/usr/bin/python3
"""Host emulation of gemm_experts_f16_kernel's index math (src/cuda/gemm.cu), for changing it
without a GPU: one block of 256 Q2_K rows x 64 pairs over 2 super-blocks, staged as issue()
copies, the activations expanded to their xf_slot as expand_b() does, each thread's A values
from its stage rows (sub-block tig at shift sh) multiplied into the k-slots that the m16n8k16
fragments give it (a0..a3: slots 2 tig + e and 2 tig + 8 + e of k-step ks), against the
weights decoded in ggml's Q2_K order. Prints the largest error relative to the largest output
(FP16 operands: ~5e-4); a wrong slot, shift or offset gives ~1. Also checks TABLE's PRMT
selectors (DSV4_XF_TABLE) for every word of four codes. Needs Debian's python3-numpy.
"""
import numpy as np
rng=np.random.default_rng(1)
R,P,NSB=256,64,2; K=256*NSB
# Q2_K super-blocks in the engine's layout: 16 scale bytes + 64 code bytes; d, dmin halves apart
codes=rng.integers(0,256,(R,NSB,80),dtype=np.uint8)
dw=(rng.random((R,NSB,2))*0.01+0.001).astype(np.float16)
aq=rng.integers(-127,128,(P,K)).astype(np.int8); adx=(rng.random((P,NSB))*0.02).astype(np.float32)
# reference weights (ggml order)
W=np.zeros((R,K),np.float64)
for r in range(R):
  for sb in range(NSB):
    sc=codes[r,sb,:16]; q=codes[r,sb,16:]; d=float(dw[r,sb,0]); dm=float(dw[r,sb,1])
    for n in range(2):
      for j in range(4):
        for u in range(2):
          isc=8*n+2*j+u
          for l in range(16):
            v=128*n+32*j+16*u+l
            qq=(int(q[32*n+16*u+l])>>(2*j))&3
            W[r,256*sb+v]=d*(sc[isc]&15)*qq-dm*(sc[isc]>>4)
X=aq.astype(np.float64)*np.repeat(adx,256,axis=1)
ref=W@X.T   # [R][P]
def xf_slot(tig,j): return 2*(16*(j>>2)+8*((j>>1)&1)+2*tig)
acc=np.zeros((R,P))
ntiles=K//64
for i in range(ntiles):
  sb,tq=i>>2,i&3
  # stage, as issue() copies it
  st_codes=np.zeros((R,32),np.uint8); st_sc=np.zeros((R,4),np.uint8); st_dw=np.zeros((R,2),np.float16)
  flat=codes.reshape(R,NSB*80)
  for t in range(256):
    off=sb*80+16+32*(tq>>1)+(t&1)*16
    r=t>>1; st_codes[r,(t&1)*16:(t&1)*16+16]=flat[r,off:off+16]
    r=128+(t>>1); st_codes[r,(t&1)*16:(t&1)*16+16]=flat[r,off:off+16]
    st_sc[t]=flat[t,sb*80+4*tq:sb*80+4*tq+4]; st_dw[t]=dw[t,sb]
  st_act=aq[:,i*64:(i+1)*64].view(np.uint8); st_dx=adx[:,sb]
  # expand_b: B rows of 72 halves
  B=np.zeros((P,72),np.float64)
  for t in range(256):
    c=t>>2; part=t&3; v=st_act[c,16*part:16*part+16]
    for j in range(16):
      q=int(np.uint8(v[j]).view(np.int8))
      B[c,xf_slot(part,j&~1)//2+(j&1)]=np.float16(np.float16(q)*np.float16(st_dx[c]))
  # A fragments and MMAs per warp
  for warp in range(8):
    for lane in range(32):
      gid,tig=lane>>2,lane&3
      sh=2*(2*(i&1)+(tig>>1))
      for mt in range(2):
        for h in range(2):
          r=32*warp+16*mt+gid+8*h
          q16=st_codes[r,(tig&1)*16:(tig&1)*16+16]
          sc=int(st_sc[r,tig]); d=float(st_dw[r,0]); dm=float(st_dw[r,1])
          a=np.float16(d*256*(sc&15)); b=np.float16(-(dm*256*(sc>>4)))
          for ks in range(4):
            for hi in range(2):
              for e in range(2):
                j=4*ks+2*hi+e
                qq=(int(q16[j])>>sh)&3
                wv=float(np.float16(qq*float(a)+float(b)))
                slot=16*ks+8*hi+2*tig+e
                # MMA: row r, k-slot -> times B[pair][slot] for every pair
                acc[r,:]+=wv*B[:,slot]
out=acc/256
# TABLE's selector: for every word m of four 2-bit codes (one a byte), PRMT of the tables
# {w0, w1}, {w2, w3} by m * 0x22 + 0x10101010 (its low 16 bits), and by that >> 16, must give
# halves (w[q0], w[q1]) and (w[q2], w[q3])
def prmt(a, b, c):
    by = [(a >> 8 * k) & 0xFF for k in range(4)] + [(b >> 8 * k) & 0xFF for k in range(4)]
    return sum(by[(c >> 4 * k) & 7] << 8 * k for k in range(4))
W4 = [0x1111, 0x2222, 0x3333, 0x4444]   # four distinct "halves"
T0, T1 = W4[0] | W4[1] << 16, W4[2] | W4[3] << 16
for codes in range(256):
    q = [(codes >> 2 * k) & 3 for k in range(4)]
    m = q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24
    sel = (m * 0x22 + 0x10101010) & 0xFFFFFFFF
    assert prmt(T0, T1, sel) == W4[q[0]] | W4[q[1]] << 16, (q, hex(sel))
    assert prmt(T0, T1, sel >> 16) == W4[q[2]] | W4[q[3]] << 16, (q, hex(sel))
print('TABLE selectors: all 256 code words pick their halves')
err=np.abs(out-ref).max(); mag=np.abs(ref).max()
print('max abs err',err,'max |ref|',mag, 'rel', err/mag)
raise SystemExit(0 if err/mag < 2e-3 else 1)
