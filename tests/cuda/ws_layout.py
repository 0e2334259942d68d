#!/usr/bin/python3
"""Host emulation of the warp-specialised experts kernel's index math (src/cuda/sm90a/experts_ws.cu),
for changing it without a GPU: the producer's copies (as issue() makes them, every address) into
the stages, the super-block buffers and the B chunks, then each consumer thread's reads (its
stage rows' code bytes, scale bytes, (d, dmin) or d, the B pairs its wgmma take) checked against
what the WG form's definitions say the thread must see: the weight row's bytes of the tile, the
pair's activation codes and dx. Also that every (pair, output row) of the round is written once,
by the thread whose sums hold that row. Both types, items split over a persistent grid and one
item a block, a row tail past N, groups of 1 to 64 pairs. Tiles are taken in order (what may fly
at once is tests/cuda/ws_protocol.py's concern). A CTest: ws_layout.
"""
import random, sys

from ws_source import ws_constant

Q2K, IQ2 = 'Q2_K', 'IQ2_XXS'
STAGE_ROWS, PAIRS, KT = 512, 64, 64   # kWsStageRows, kKqFlatPairs, kXfK

STAGES = {IQ2: ws_constant('kWsStagesIq2'), Q2K: ws_constant('kWsStagesQ2k')}   # each type's stages

def emulate(T, K, N, rpe, groups, blocks_fn, seed):
    rng = random.Random(seed)
    iq2 = T == IQ2
    NS = STAGES[T]
    out_rows = STAGE_ROWS // 2 if iq2 else STAGE_ROWS
    nsb, ntiles = K // 256, K // KT
    sbb = 64 if iq2 else 80                     # code bytes a row's super-block (Q2_K: 16 scale bytes first)
    n_exp = 1 + max(g[0] for g in groups)
    rows = rpe * n_exp
    # weights: a byte's value is its own address's tag, so a read names what it read
    def wbyte(tensor, off): return (tensor, off)
    def wd(tensor, half): return ('d', tensor, half)
    P = sum(g[2] for g in groups)
    pairs = list(range(P)); rng.shuffle(pairs)
    act_div, AL = 1, K
    starts = []
    s = 0
    for g in groups: starts.append(s); s += g[2]
    grp = [(g[0], starts[i], g[2]) for i, g in enumerate(groups)]
    nx = (N + out_rows - 1) // out_rows
    items = nx * len(grp)
    blocks = blocks_fn(nx)
    written = {}

    def item(it):
        e, ps, cnt = grp[it // nx]
        cnt = min(cnt, PAIRS)
        nv = (cnt + 7) // 8
        used = 16 * ((cnt + 15) // 16)
        return dict(wbase=e * rpe, pairs=pairs[ps:ps + cnt], cnt=cnt, m0=(it % nx) * out_rows, nv=nv, used=used)
    def w_row(w, r): return w['wbase'] + min(w['m0'] + r % out_rows, N - 1)

    for b in range(blocks):
        if b >= items: continue
        my = (items - b + blocks - 1) // blocks
        # shared memory: stage regions by (stage, region) -> {offset: tag}; super-block buffers
        smem = {}
        def put(region, off, n, src):   # n bytes (or a 4-byte word) from src (tag, offset)
            for k in range(n): smem[(region, off + k)] = (src[0], src[1] + k) if len(src) == 2 else src
        def get(region, off): return smem.get((region, off))
        G = my * ntiles
        for g in range(G):
            k, i = divmod(g, ntiles)
            w = item(b + k * blocks)
            st, sb = g % NS, i >> 2
            # ---- the producer's issue(g): its 128 threads
            for t in range(128):
                act_off, dx_off = [], []
                for j in range(2):
                    c = t + 128 * j
                    arow = w['pairs'][min(c >> 2, w['cnt'] - 1)] // act_div
                    act_off.append(arow * AL + (c & 3) * 16); dx_off.append(arow * (AL // 256))
                NR = 2 if iq2 else 8
                sb_r = [w_row(w, t + 128 * j if iq2 else (t >> 1) + 64 * j) * nsb for j in range(NR)]
                for j in range(2):
                    c = t + 128 * j
                    if (c >> 2) < w['used']:
                        put(('act', st), c * 16, 16, ('aq', act_off[j] + i * KT))
                        put(('dx', st), c * 4, 1, ('ad', dx_off[j] + sb, 'f'))
                if iq2:
                    for j in range(4):
                        r, sbr = t + 128 * j, sb_r[j & 1]
                        put(('codes', st), r * 16, 16, ('wq%d' % (j >> 1), sbr * 64 + i * 16))
                        if (i & 3) == 0:
                            put(('dw', st), r * 4, 1, ('wd%d' % (j >> 1), (sbr + sb) & ~1, 'w'))
                else:
                    if not (i & 1):
                        for j in range(8):
                            put(('codes', st), ((t >> 1) + 64 * j) * 32 + (t & 1) * 16, 16,
                                ('wq0', sb_r[j] * 80 + sb * 80 + 16 + 32 * ((i & 3) >> 1) + (t & 1) * 16))
                    if (i & 3) == 0:
                        buf = (g >> 2) & 1
                        for j in range(8):
                            r, sbr = (t >> 1) + 64 * j, sb_r[j] + sb
                            if t & 1: put(('dd', buf), r * 4, 1, ('wd0', sbr * 2, 'w'))
                            else: put(('sc', buf), r * 16, 16, ('wq0', sbr * 80))
            # ---- the B expansion: each chunk c < used from the stage's own act and dx
            B = {}
            for t in range(128):
                for j in range(2):
                    c = t + 128 * j
                    if (c >> 2) < w['used']:
                        B[c] = (get(('act', st), c * 16), get(('dx', st), c * 4))
            # ---- the consumers' reads
            NV = 2 * ((w['nv'] + 1) // 2)
            assert 8 * NV <= w['used'], (8 * NV, w['used'])
            for n in range(8 * NV):   # the pairs the wgmma read: their 4 chunks hold the pair's codes
                arow = w['pairs'][min(n, w['cnt'] - 1)]
                for part in range(4):
                    a, dx = B[4 * n + part]
                    assert a == ('aq', arow * AL + i * KT + part * 16), (T, g, n, part, a)
                    assert dx == ('ad', arow * (AL // 256) + sb, 'f'), (T, g, n, dx)
            for cw in range(16):
                for lane in range(32):
                    gid, tig = lane >> 2, lane & 3
                    for mt in range(2):
                        for h in range(2):
                            r = 256 * mt + 16 * cw + gid + 8 * h if iq2 else 32 * cw + 16 * mt + gid + 8 * h
                            wr = w_row(w, r)
                            if iq2:
                                ten = 'wq%d' % mt
                                got = get(('codes', st), r * 16 + (tig >> 1) * 8)
                                assert got == (ten, wr * nsb * 64 + i * 16 + (tig >> 1) * 8), (T, g, cw, lane, mt, h, got)
                                if (i & 3) == 0:
                                    dd = get(('dw', st), r * 4)
                                    dpar = (wr * nsb) & 1
                                    hi = (dpar ^ (i >> 2)) & 1
                                    assert dd == ('wd%d' % mt, (wr * nsb + sb) & ~1, 'w'), (T, g, dd)
                                    assert ((wr * nsb + sb) & ~1) + hi == wr * nsb + sb   # the half it takes
                            else:
                                cs = (g & ~1) % NS
                                for ks in (0, 2):
                                    got = get(('codes', cs), r * 32 + (tig & 1) * 16 + 4 * ks)
                                    want = ('wq0', wr * nsb * 80 + sb * 80 + 16 + 32 * ((i & 3) >> 1) + (tig & 1) * 16 + 4 * ks)
                                    assert got == want, (T, g, cw, lane, mt, h, ks, got, want)
                                buf = (g >> 2) & 1
                                sc = get(('sc', buf), r * 16 + 4 * (i & 3) + tig)
                                assert sc == ('wq0', (wr * nsb + sb) * 80 + 4 * (i & 3) + tig), (T, g, sc)
                                assert get(('dd', buf), r * 4) == ('wd0', (wr * nsb + sb) * 2, 'w')
            # ---- the epilogue, at the item's last tile
            if i == ntiles - 1:
                for cw in range(16):
                    for lane in range(32):
                        gid, tig = lane >> 2, lane & 3
                        for nt in range(NV):
                            for e in range(4):
                                c = 8 * nt + 2 * tig + (e & 1)
                                if c >= w['cnt']: continue
                                pc = w['pairs'][c]
                                mts = [0] if iq2 else [0, 1]
                                for mt in mts:
                                    if iq2: n = w['m0'] + 16 * cw + gid + 8 * (e >> 1)
                                    else: n = w['m0'] + 32 * cw + 16 * mt + gid + 8 * (e >> 1)
                                    # the sums' row: the thread's fragment row gid + 8 (e >> 1) of
                                    # m-tile mt, i.e. its stage row (IQ2_XXS: gate's and up's)
                                    r = (16 * cw + gid + 8 * (e >> 1)) if iq2 else 32 * cw + 16 * mt + gid + 8 * (e >> 1)
                                    assert n == w['m0'] + r % out_rows
                                    if n < N:
                                        key = (pc, n)
                                        assert key not in written, ('written twice', T, key)
                                        written[key] = (w['wbase'], n)
    # every (pair, row < N) of every group once, from its expert's rows
    for gi, (e, ps, cnt) in enumerate(grp):
        for pc in pairs[ps:ps + cnt]:
            for n in range(N):
                assert written.get((pc, n)) == (e * rpe, n), ('missing', T, pc, n)
    return len(written)

def main():
    groups = [(2, 0, 40), (0, 0, 64), (0, 0, 5), (1, 0, 1), (3, 0, 17)]
    total = 0
    for T in (IQ2, Q2K):
        for K in (256, 512):
            for N, rpe in ((300, 303), (600, 603)):
                for name, fn in (('one item a block', lambda nx: nx * len(groups)), ('persistent, 3 blocks', lambda nx: 3)):
                    total += emulate(T, K, N, rpe, groups, fn, 7)
    print(f'ws layout: ok ({total} outputs, every read its tile\'s bytes)')

main()
