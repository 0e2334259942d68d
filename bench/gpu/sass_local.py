#!/usr/bin/env python3
"""SASS opcode counts of a locally built cubin, without cuobjdump or nvdisasm (this machine has
ptxas only). Hopper instructions are 16 bytes; the low 12 bits of each select its opcode (the
modifiers live elsewhere). sass_opmap.json maps those bits to mnemonics, learned from a device
run: Nsight Compute's per-instruction table (scripts/gpu.sh NCU_SOURCE=1, ncu_source.csv) paired
line by line with a local cubin of the same source and flags (run 121).

  nvcc -DDSV4_HAVE_CUDA=1 -Iinclude -Isrc -O3 -DNDEBUG -arch=sm_90 -cubin --expt-relaxed-constexpr \\
       -lineinfo -std=c++17 -o /tmp/k.cubin src/cuda/attention_rows_f16.cu
  bench/gpu/sass_local.py count /tmp/k.cubin attn_rows_f16_kernelILj8   # opcodes by count, the
                                                  # MMAs with a WARPSYNC just before them
  bench/gpu/sass_local.py learn /tmp/k.cubin ncu_source.csv attn_rows_f16_kernelILj8   # extend the map
  bench/gpu/sass_local.py learn-sass k.sass   # extend it from `cuobjdump -sass` text (any cubin's,
                                              # run on the device: run 166)
Static counts (each instruction once), not executed ones.
"""
import collections, csv, json, os, re, struct, sys

MAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'sass_opmap.json')


def text_sections(path):
    d = open(path, 'rb').read()
    if d[:4] != b'\x7fELF' or d[4] != 2:
        sys.exit(f'{path}: not a 64-bit ELF cubin')
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3A)
    sh = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    stro = sh[shstrndx][4]
    out = {}
    for s in sh:
        name = d[stro + s[0]:d.index(b'\0', stro + s[0])].decode()
        if name.startswith('.text.'):
            out[name[6:]] = d[s[4]:s[4] + s[5]]
    return out


def kernel(path, key):
    hits = [(n, b) for n, b in text_sections(path).items() if key in n]
    if len(hits) != 1:
        sys.exit(f'{len(hits)} kernels match {key!r} in {path}')
    return hits[0]


def words(b):
    return [struct.unpack_from('<Q', b, 16 * i)[0] for i in range(len(b) // 16)]


def learn(cubin, table, key):
    name, b = kernel(cubin, key)
    rows = list(csv.reader(open(table, errors='replace')))
    h = next(i for i, r in enumerate(rows) if 'Source' in [c.strip() for c in r])
    hdr = [c.strip() for c in rows[h]]
    ai, si = hdr.index('Address'), hdr.index('Source')
    lines = sorted((int(r[ai], 16), r[si].strip()) for r in rows[h + 1:] if len(r) > si and r[ai].strip().startswith('0x'))
    ws = words(b)
    if len(lines) != len(ws):
        sys.exit(f'{len(lines)} lines in the table, {len(ws)} instructions in the cubin: not the same build')
    m = json.load(open(MAP)) if os.path.exists(MAP) else {}
    votes = collections.defaultdict(collections.Counter)
    for w, (_, t) in zip(ws, lines):
        votes[w & 0xfff][re.sub(r'^@!?U?P\w+\s+', '', t).split(' ')[0].split('.')[0]] += 1
    for k, v in votes.items():
        m[str(k)] = v.most_common(1)[0][0]
    json.dump(dict(sorted(m.items(), key=lambda kv: int(kv[0]))), open(MAP, 'w'), indent=0)
    print(f'{len(votes)} opcodes from {name[:80]}; the map has {len(m)}')


def learn_sass(text):
    """The map from cuobjdump -sass output: each instruction line carries its first 64-bit word."""
    m = json.load(open(MAP)) if os.path.exists(MAP) else {}
    votes = collections.defaultdict(collections.Counter)
    for line in open(text, errors='replace'):
        mm = re.search(r'/\*[0-9a-f]{4,}\*/\s+(.*?);\s*/\* 0x([0-9a-f]{16}) \*/', line)
        if mm:
            t = re.sub(r'^@!?U?P\w+\s+', '', mm.group(1).strip())
            votes[int(mm.group(2), 16) & 0xfff][t.split(' ')[0].split('.')[0]] += 1
    for k, v in votes.items():
        m[str(k)] = v.most_common(1)[0][0]
    json.dump(dict(sorted(m.items(), key=lambda kv: int(kv[0]))), open(MAP, 'w'), indent=0)
    print(f'{len(votes)} opcodes from {text}; the map has {len(m)}')


def count(cubin, key=''):
    m = {int(k): v for k, v in json.load(open(MAP)).items()}
    for name, b in text_sections(cubin).items():
        if key not in name:
            continue
        ops = [m.get(w & 0xfff, '?%03x' % (w & 0xfff)) for w in words(b)]
        c = collections.Counter(ops)
        mma = [i for i, o in enumerate(ops) if o in ('HMMA', 'IMMA', 'HGMMA')]
        synced = sum(1 for i in mma if 'WARPSYNC' in ops[max(0, i - 3):i])
        print(f'{len(ops)} instructions  {name[:100]}')
        print('  ' + ', '.join(f'{o} {n}' for o, n in c.most_common(24)))
        print(f'  MMAs {len(mma)}, {synced} with a WARPSYNC in the 3 instructions before')


if __name__ == '__main__':
    if len(sys.argv) >= 5 and sys.argv[1] == 'learn':
        learn(*sys.argv[2:5])
    elif len(sys.argv) >= 3 and sys.argv[1] == 'learn-sass':
        learn_sass(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == 'count':
        count(*sys.argv[2:4])
    else:
        sys.exit(__doc__)
