#!/usr/bin/env bash
# Builds the comparison cases for the HF oracle: random-weight F32 GGUFs (dsv4 synth),
# token lists and dsv4's own logits (plain numerics).
# usage: tools/hf/make_cases.sh DSV4_BINARY OUTDIR [N_TOKENS]
# Writes OUTDIR/cases.txt (name|synth arguments), <case>.gguf, <case>.tok (comma-separated
# ids), <case>.ours.bin (float32 [n][vocab]) and SHA256SUMS of the GGUFs, so that
# run_suite.sh can rebuild byte-identical GGUFs elsewhere instead of copying them.
set -euo pipefail
DSV4=$(realpath "$1")
D=$2
N=${3:-700}
mkdir -p "$D"
: > "$D/cases.txt"

# name, token seed, synth arguments
mk() {
    local name=$1 tseed=$2
    shift 2
    echo "$name|$*" >> "$D/cases.txt"
    "$DSV4" synth "$@" --vocab byte -o "$D/$name.gguf" 2>/dev/null
    # uniform random byte tokens (the byte vocabulary has >= 256 ids)
    python3 -c "import random,sys; r=random.Random(int(sys.argv[1])); print(','.join(str(r.randrange(256)) for _ in range(int(sys.argv[2]))))" \
        "$tseed" "$N" > "$D/$name.tok"
    "$DSV4" logits -m "$D/$name.gguf" --tokens "$(cat "$D/$name.tok")" --out "$D/$name.ours.bin" --numerics plain
}

# tiny: 4 layers (ratios 0,0,4,128), window 16, indexer top-k 8 -> selection active past 36 tokens
mk tiny-s1 1 tiny --seed 1
mk tiny-s2 2 tiny --seed 2
mk tiny-s3 3 tiny --seed 3
# tiny with top-k >= every row count: no selection
mk tiny-s1-nosel 1 tiny --seed 1 --top-k 1024
# small: 6 layers (0,0,4,128,4,128), window 128, top-k 32 -> selection past 132 tokens
mk small-s1 1 small --seed 1
mk small-s2 2 small --seed 2
mk small-s1-nosel 1 small --seed 1 --top-k 1024
(cd "$D" && sha256sum ./*.gguf > SHA256SUMS)
ls -la "$D"
