#!/usr/bin/env bash
# Serving benchmark: starts `dsv4 serve` on a free loopback port and drives it with
# tools/node/serve_bench.mjs at 1, 4 and 16 concurrent clients (streamed chat, greedy,
# ignore_eos, a fixed number of output tokens). Reports aggregate decode tokens/s, TTFT and
# TPOT per request, the server's own decode rate and the committed KV bytes per resident
# session (from /metrics), as a markdown table on stdout and JSON under bench/out/serve/.
#
# Usage: bench/serve_bench.sh [BUILD_DIR] [extra dsv4 serve args...]
#   env: LEVELS="1 4 16"  TOKENS=64  PROMPT_WORDS=120  REQUESTS="4 2 1" (per client, per level)
#        CTX=4096  MODEL=path.gguf (default: the built-in default model)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
DSV4="$BUILD/dsv4"
OUT="$ROOT/bench/out/serve"
LEVELS=(${LEVELS:-1 4 16})
REQUESTS=(${REQUESTS:-4 2 1})
TOKENS="${TOKENS:-64}"
PROMPT_WORDS="${PROMPT_WORDS:-120}"
CTX="${CTX:-4096}"
mkdir -p "$OUT"
[ -x "$DSV4" ] || { echo "serve_bench: no $DSV4 (build first)" >&2; exit 1; }
command -v node >/dev/null || { echo "serve_bench: node is needed" >&2; exit 1; }

model_args=()
[ -n "${MODEL:-}" ] && model_args=(-m "$MODEL")
"$DSV4" serve "${model_args[@]}" --host 127.0.0.1 --port 0 --ctx "$CTX" --max-sessions 16 "$@" \
  > "$OUT/serve.stdout" 2> "$OUT/serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "listening on" "$OUT/serve.stdout" 2>/dev/null && break
  kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log" >&2; exit 1; }
  sleep 0.1
done
URL="$(grep -o 'http://[0-9.:]*' "$OUT/serve.stdout" | head -1)"
[ -n "$URL" ] || { echo "serve_bench: the server did not start" >&2; cat "$OUT/serve.log" >&2; exit 1; }

metric() { curl -s "$URL/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

# Warm-up (page in the weights, first allocations).
node "$ROOT/tools/node/serve_bench.mjs" --url "$URL" --clients 1 --requests 1 --tokens 8 --prompt-words 20 > /dev/null

printf '| clients | requests | prompt tok (mean) | output tok | aggregate decode tok/s | server decode tok/s | TTFT mean / p95 (ms) | TPOT mean / p95 (ms) | KV committed per resident session |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for i in "${!LEVELS[@]}"; do
  c="${LEVELS[$i]}"
  r="${REQUESTS[$i]:-1}"
  tok0=$(metric dsv4_completion_tokens_total)
  dec0=$(metric dsv4_decode_seconds_total)
  node "$ROOT/tools/node/serve_bench.mjs" --url "$URL" --clients "$c" --requests "$r" --tokens "$TOKENS" \
    --prompt-words "$PROMPT_WORDS" > "$OUT/c$c.json"
  tok1=$(metric dsv4_completion_tokens_total)
  dec1=$(metric dsv4_decode_seconds_total)
  committed=$(metric dsv4_kv_committed_bytes)
  resident=$(metric dsv4_sessions_resident)
  curl -s "$URL/metrics" > "$OUT/c$c.metrics"
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const [tok0, tok1, dec0, dec1, committed, resident] = process.argv.slice(2).map(Number);
    const server = dec1 > dec0 ? (tok1 - tok0) / (dec1 - dec0) : 0;
    const per = resident > 0 ? committed / resident : 0;
    const mib = (b) => (b / 1048576).toFixed(2) + " MiB";
    console.log(`| ${r.clients} | ${r.requests} | ${r.prompt_tokens_mean.toFixed(0)} | ${r.completion_tokens} | ` +
      `${r.aggregate_decode_tps.toFixed(1)} | ${server.toFixed(1)} | ${r.ttft_ms_mean.toFixed(0)} / ${r.ttft_ms_p95.toFixed(0)} | ` +
      `${r.tpot_ms_mean.toFixed(1)} / ${r.tpot_ms_p95.toFixed(1)} | ${mib(per)} (${resident} resident, ${mib(committed)} in all) |`);
  ' "$OUT/c$c.json" "$tok0" "$tok1" "$dec0" "$dec1" "$committed" "$resident"
done
