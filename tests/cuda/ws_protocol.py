#!/usr/bin/python3
"""Host model of the warp-specialised experts kernel's stage protocol (src/cuda/sm90a/experts_ws.cu),
for changing it without a GPU: the producer's copies and B expansion, the consumers' reads, the
`full` and `empty` mbarriers, under random interleavings of one producer and several consumers
at random speeds. Checks that every read finds the tile's own data, that no write lands in a
region a consumer is still reading (tile g's B, its code bytes: IQ2_XXS the stage's own, Q2_K the
even tile's; Q2_K's super-block parts in two buffers by the block's super-block count), and that
no interleaving deadlocks. A copy counts as written from its issue on (cp.async lands any time
until the wait), so a write into a region still being read is a race whenever it could happen.

  tests/cuda/ws_protocol.py            # both types, the kernel's constants (read from its source),
                                      # several item shapes (a CTest: ws_protocol)
"""
import random, sys

from ws_source import ws_constant

def run(q2k, NS, D, ntiles, items, consumers, seed):
    rng = random.Random(seed)
    G = ntiles * items
    # the region's content: which tile (or super-block) it holds, and who is reading it now
    content, readers = {}, {}
    full_arrivals = [0] * NS; empty_arrivals = [0] * NS
    full_phase = [0] * NS; empty_phase = [0] * NS   # completed phases
    def regions_written(g, part):
        s = g % NS
        if part == 'copies':
            r = [('act', s)]
            if not q2k or g % 2 == 0: r.append(('codes', s))
            if q2k and g % 4 == 0: r.append(('sbq', (g >> 2) & 1))
            return r
        return [('b', s)]
    def tag(region, g):
        return g >> 2 if region[0] == 'sbq' else (g & ~1 if region[0] == 'codes' and q2k else g)
    def regions_read(g):
        s = g % NS
        r = [('b', s), ('codes', (g & ~1) % NS if q2k else s)]
        if q2k: r.append(('sbq', (g >> 2) & 1))
        return r
    def write(region, g):
        if readers.get(region):
            raise AssertionError(f'tile {g}: {region} written while tiles {sorted(readers[region])} read it')
        content[region] = tag(region, g)
    # the producer as a sequence of steps, each runnable when its wait is satisfied
    def producer():
        for g in range(min(D, G)):
            yield None
            for r in regions_written(g, 'copies'): write(r, g)
        for g in range(G):
            yield None   # (its copies of tile g landing)
            for r in regions_written(g, 'expand'): write(r, g)
            full_arrivals[g % NS] += 1
            if full_arrivals[g % NS] == 1:
                full_arrivals[g % NS] = 0; full_phase[g % NS] += 1
            j = g + D
            if j < G:
                if j >= NS:
                    ph = j // NS - 1
                    yield ('empty', j % NS, ph)
                for r in regions_written(j, 'copies'): write(r, j)
    def consumer(c):
        for g in range(G):
            yield ('full', g % NS, g // NS)
            for r in regions_read(g):
                assert content.get(r) == tag(r, g), f'consumer {c} tile {g}: {r} holds {content.get(r)}, not {tag(r, g)}'
                readers.setdefault(r, set()).add((c, g))
            yield None   # reading (the tile's MMAs)
            for r in regions_read(g):
                assert content.get(r) == tag(r, g), f'consumer {c} tile {g}: {r} overwritten while read'
                readers[r].discard((c, g))
            frees = ([] if g % 2 == 0 else [g - 1, g]) if q2k else [g]
            for f in frees:
                empty_arrivals[f % NS] += 1
                if empty_arrivals[f % NS] == consumers:
                    empty_arrivals[f % NS] = 0; empty_phase[f % NS] += 1
    agents = [producer()] + [consumer(c) for c in range(consumers)]
    waits = [None] * len(agents); done = [False] * len(agents)
    def ready(w):
        if w is None: return True
        kind, s, ph = w
        return (full_phase if kind == 'full' else empty_phase)[s] > ph
    while not all(done):
        runnable = [i for i in range(len(agents)) if not done[i] and ready(waits[i])]
        if not runnable:
            raise AssertionError(f'deadlock: waits {waits}')
        i = rng.choice(runnable)
        try:
            waits[i] = next(agents[i])
        except StopIteration:
            done[i] = True

def constants():
    # each type's stages and the AHEADs the kernel takes
    get = ws_constant
    return {False: get('kWsStagesIq2'), True: get('kWsStagesQ2k')}, range(get('kWsAhead'), get('kWsAheadMost') + 1)

def main():
    stages, aheads = constants()
    print(f'stages IQ2_XXS {stages[False]}, Q2_K {stages[True]}; ahead {list(aheads)}')
    bad = 0
    for q2k in (False, True):
        for D in aheads:
            for ntiles in (4, 8, 32, 64):
                for items in (1, 2, 5):
                    for seed in range(30):
                        try:
                            run(q2k, stages[q2k], D, ntiles, items, 3, seed)
                        except AssertionError as e:
                            bad += 1
                            if bad < 5: print(('Q2_K' if q2k else 'IQ2_XXS'), D, ntiles, items, seed, e)
    # the constraints the kernel's static_asserts state: seven stages break Q2_K's super-block
    # parts' two buffers (six do not: an even tile's stage is freed with the odd tile after it),
    # and Q2_K deadlocks with kAhead = kStages (its producer would wait for a tile it has yet to
    # expand; kStages - 1 does not, the producer expanding a tile before issuing copies)
    for seed in range(200): run(True, 6, 3, 8, 3, 3, seed)
    for seed in range(200): run(True, 5, 4, 8, 3, 3, seed)
    for ns, d, what in ((7, 3, 'seven stages, Q2_K'), (5, 5, 'kAhead = kStages, Q2_K')):
        try:
            for seed in range(200): run(True, ns, d, 8, 3, 3, seed)
            print(f'{what}: no fault found (expected one)'); bad += 1
        except AssertionError as e:
            print(f'{what}: fails as expected ({str(e)[:60]}...)')
    print('protocol: ' + ('ok' if bad == 0 else f'{bad} faults'))
    sys.exit(1 if bad else 0)

main()
