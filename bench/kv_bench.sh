#!/usr/bin/env bash
# KV memory, lazy vs eager, in one run: a session with a 1,048,576-token logical context
# holding an N-token conversation (default 2048) on MODEL. For each mode: committed, live
# and logical KV bytes, decode tokens/s at the frontier, and the process's peak resident
# memory (/usr/bin/time -v). Usage: bench/kv_bench.sh MODEL.gguf [tokens] [gen] [backend]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
MODEL="$1"; N="${2:-2048}"; GEN="${3:-16}"; BACKEND="${4:-cpu}"
OUT="$ROOT/bench/out"; mkdir -p "$OUT"
name="$(basename "$MODEL" .gguf)"
for mode in lazy eager; do
  flag=""; [ "$mode" = eager ] && flag="--kv-eager"
  /usr/bin/time -v "$ROOT/build/dsv4" bench -m "$MODEL" --backend "$BACKEND" $flag --ctx 1048576 \
    --prompt-file "$ROOT/bench/prompts/promessi_sposi.txt" --ctx-start "$N" --ctx-max "$N" \
    --gen-tokens "$GEN" --csv "$OUT/$name.kv-$mode.csv" 2> "$OUT/$name.kv-$mode.time"
done
echo "mode | KV logical | KV committed | KV live | decode tok/s | peak RSS"
for mode in lazy eager; do
  rss_kb=$(grep "Maximum resident set size" "$OUT/$name.kv-$mode.time" | awk '{print $NF}')
  tail -n 1 "$OUT/$name.kv-$mode.csv" | awk -F, -v m="$mode" -v rss="$rss_kb" \
    '{printf "%s | %.1f MiB | %.1f MiB | %.1f MiB | %s | %.1f MiB\n", m, $6/1048576, $8/1048576, $9/1048576, $5, rss/1024}'
done
