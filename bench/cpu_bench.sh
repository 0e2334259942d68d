#!/usr/bin/env bash
# CPU benchmark, dsv4 and llama.cpp (node-llama-cpp, CPU build) side by side on the same
# GGUF, the same token ids and the same frontiers, in one run. Writes CSVs under bench/out/.
# Usage: bench/cpu_bench.sh MODEL.gguf [frontiers (comma list)] [gen tokens]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
MODEL="$1"; FRONTIERS="${2:-512,1024,2048}"; GEN="${3:-16}"
OUT="$ROOT/bench/out"; mkdir -p "$OUT"
name="$(basename "$MODEL" .gguf)"
DSV4="$ROOT/build/dsv4"
"$DSV4" tokenize -m "$MODEL" --file "$ROOT/bench/prompts/promessi_sposi.txt" > "$OUT/$name.tokens.json"
first="${FRONTIERS%%,*}"; last="${FRONTIERS##*,}"
# dsv4: frontiers as an explicit step when they are evenly spaced from the first
step=$(( $(echo "$FRONTIERS" | cut -d, -f2 -s || echo "$first") - first )); [ "$step" -gt 0 ] || step="$first"
"$DSV4" bench -m "$MODEL" --backend cpu --prompt-file "$ROOT/bench/prompts/promessi_sposi.txt" \
  --ctx-start "$first" --ctx-max "$last" --step-incr "$step" --gen-tokens "$GEN" --csv "$OUT/$name.dsv4.csv"
node "$ROOT/tools/node/llama_bench.mjs" "$MODEL" "$OUT/$name.tokens.json" "$OUT/$name.llama.csv" \
  --frontiers "$FRONTIERS" --gen "$GEN" --threads "$(nproc)"
echo "ctx | dsv4 prefill tok/s | llama.cpp prefill tok/s | dsv4 decode tok/s | llama.cpp decode tok/s | dsv4 KV committed"
paste -d, <(tail -n +2 "$OUT/$name.dsv4.csv") <(tail -n +2 "$OUT/$name.llama.csv") |
  awk -F, '{printf "%s | %s | %s | %s | %s | %.2f MiB\n", $1, $3, $13, $5, $15, $8/1048576}'
