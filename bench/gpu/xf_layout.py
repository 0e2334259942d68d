#!/usr/bin/python3
"""Host emulation of gemm_experts_f16_kernel's index math (src/cuda/experts_f16.cuh), for changing it
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
def expand_b(st_act,st_dx):
  """expand_b: a tile's activation codes (pairs x 64 bytes) as B rows of 72 halves, each thread's
  16 values (pair t / 4, part t % 4) at their xf_slot, q * dx rounded as the kernel rounds it"""
  B=np.zeros((st_act.shape[0],72),np.float64)
  for t in range(4*st_act.shape[0]):
    c=t>>2; part=t&3; v=st_act[c,16*part:16*part+16]
    for j in range(16):
      q=int(np.uint8(v[j]).view(np.int8))
      B[c,xf_slot(part,j&~1)//2+(j&1)]=np.float16(np.float16(q)*np.float16(st_dx[c]))
  return B
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
  B=expand_b(st_act,st_dx)
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
# ---- IQ2_XXS gate+up (gemm_experts_f16_kernel<T_IQ2_XXS>) ----------------------------------
# A block: 128 rows of gate (stage rows 0..127, m-tile 0 of each warp) and the same 128 of up
# (stage rows 128..255, m-tile 1), each thread's 16 values of a row in a tile two grid rows of
# its 32-value group tig / 2; each half pair one PRMT of the constant bytes of +-8, 25, 43 as
# halves by the selector (grid table | sign table), times the row's scale.
import re
src = open(__file__.replace('bench/gpu/xf_layout.py', 'src/quant/iq2_grid.cpp')).read()
GRID = [int(x, 16) for x in re.findall(r'0x([0-9a-f]{16})', src)][:256]
assert len(GRID) == 256
def ksigns(i): return i | ((bin(i).count('1') & 1) << 7)
LO = {8: 0xB, 25: 0x3, 43: 0x7}; CODE = {8: 0, 25: 1, 43: 2}
HGRID = [sum((LO[(g >> 8 * t) & 0xFF] | CODE[(g >> 8 * t) & 0xFF] << 4) << 8 * t for t in range(8)) for g in GRID]
HSIGN = [sum((((ksigns(i) >> t) & 1) << 6) << 8 * t for t in range(8)) for i in range(128)]
K0, K1 = 0x40514E48, 0x60D1CEC8   # bytes 0x48 0x4E 0x51 0x40 | 0xC8 0xCE 0xD1 0x60
def prmt_s(a, b, c):   # PRMT's default mode, a nibble's bit 3 replicating the byte's sign
    by = [(a >> 8 * k) & 0xFF for k in range(4)] + [(b >> 8 * k) & 0xFF for k in range(4)]
    out = 0
    for k in range(4):
        n = (c >> 4 * k) & 0xF; v = by[n & 7]
        if n & 8: v = 0xFF if v & 0x80 else 0
        out |= v << 8 * k
    return out
def halves(w): return np.array([w & 0xFFFF, w >> 16], np.uint16).view(np.float16).astype(np.float64)
# every grid row and sign pattern: the PRMTs give the signed magnitudes exactly
for gi in range(256):
    for si in range(0, 128, 7):
        sel = HGRID[gi] | HSIGN[si]
        for w in range(2):
            for hi in range(2):
                got = halves(prmt_s(K0, K1, (sel >> 32 * w >> 16 * hi) & 0xFFFFFFFF))
                for e in range(2):
                    t = 4 * w + 2 * hi + e
                    want = ((GRID[gi] >> 8 * t) & 0xFF) * (-1 if (ksigns(si) >> t) & 1 else 1)
                    assert got[e] == want, (gi, si, t, got[e], want)
print('IQ2_XXS half selectors: every grid row and sign pattern gives its signed magnitudes')
RQ = 128; NSBQ = 2; KQ = 256 * NSBQ
qs = rng.integers(0, 256, (2, RQ, NSBQ, 64), dtype=np.uint8)            # [weight][row][sb][64]
dq = (rng.random((2, RQ, NSBQ)) * 0.002 + 0.0002).astype(np.float16)
Wq = np.zeros((2, RQ, KQ))
for wgt in range(2):
  for r in range(RQ):
    for sb in range(NSBQ):
      for ib in range(8):
        a0 = int(qs[wgt, r, sb, 8 * ib:8 * ib + 4].view(np.uint32)[0]); a1 = int(qs[wgt, r, sb, 8 * ib + 4:8 * ib + 8].view(np.uint32)[0])
        db = float(dq[wgt, r, sb]) * (0.5 + (a1 >> 28)) * 0.25
        for l in range(4):
          g = GRID[(a0 >> 8 * l) & 0xFF]; s = ksigns((a1 >> 7 * l) & 127)
          for j in range(8):
            Wq[wgt, r, 256 * sb + 32 * ib + 8 * l + j] = db * ((g >> 8 * j) & 0xFF) * (-1 if (s >> j) & 1 else 1)
aqq = rng.integers(-127, 128, (P, KQ)).astype(np.int8); adq = (rng.random((P, NSBQ)) * 0.02).astype(np.float32)
Xq = aqq.astype(np.float64) * np.repeat(adq, 256, axis=1)
refq = np.einsum('wrk,pk->wrp', Wq, Xq)
accq = np.zeros((2, RQ, P))
for i in range(KQ // 64):
  sb, tq = i >> 2, i & 3
  st_codes = np.zeros((256, 16), np.uint8); st_d = np.zeros(256, np.float16)
  for t in range(256):
    st_codes[t] = qs[t >> 7, t & 127, sb, 16 * tq:16 * tq + 16]; st_d[t] = dq[t >> 7, t & 127, sb]
  st_act = aqq[:, i * 64:(i + 1) * 64].view(np.uint8); st_dx = adq[:, sb]
  B = expand_b(st_act, st_dx)
  for warp in range(8):
    for lane in range(32):
      gid, tig = lane >> 2, lane & 3
      for mt in range(2):
        for h in range(2):
          r = 128 * mt + 16 * warp + gid + 8 * h
          gw = st_codes[r, 8 * (tig >> 1):8 * (tig >> 1) + 8]
          a0 = int(gw[:4].view(np.uint32)[0]); a1 = int(gw[4:].view(np.uint32)[0])
          s2 = np.float16(float(st_d[r]) * (0.5 + (a1 >> 28)) * 64.0)
          for ks in range(4):
            l = 2 * (tig & 1) + (ks >> 1)
            sel = HGRID[(a0 >> 8 * l) & 0xFF] | HSIGN[(a1 >> 7 * l) & 127]
            word = (sel >> 32 * (ks & 1)) & 0xFFFFFFFF
            for hi in range(2):
              hv = halves(prmt_s(K0, K1, word >> 16 * hi))
              for e in range(2):
                wv = float(np.float16(hv[e] * float(s2)))
                accq[mt, r & 127, :] += wv * B[:, 16 * ks + 8 * hi + 2 * tig + e]
outq = accq / 256
errq = np.abs(outq - refq).max(); magq = np.abs(refq).max()
print('IQ2_XXS: max abs err', errq, 'max |ref|', magq, 'rel', errq / magq)

err=np.abs(out-ref).max(); mag=np.abs(ref).max()
print('max abs err',err,'max |ref|',mag, 'rel', err/mag)
raise SystemExit(0 if err/mag < 2e-3 and errq/magq < 2e-3 else 1)
