#!/usr/bin/env bash
# The GPU sweep (run on the GPU machine, e.g. through the device tool with `.deps` carried):
# builds the dsv4 binary with CUDA, synthesises `flash --layers N` (2-bit mix) on local disk,
# and runs `dsv4 bench --backend cuda` at a 1M-token logical context, lazy and eager, writing
# CSVs and one SVG chart under $OUT (or bench/out).
#   bench/gpu_bench.sh [layers=4] [ctx-max=16384] [gen=64]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LAYERS_N=${1:-4}; CTX_MAX=${2:-16384}; GEN=${3:-64}
OUTDIR=${OUT:-$ROOT/bench/out}; mkdir -p "$OUTDIR"
source "$ROOT/bench/gpu/deps-env.sh" --headers
cmake -S . -B build-gpu-app -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDSV4_CUDA=ON \
  > "$OUTDIR/gpu_bench_configure.log" 2>&1 || { tail -20 "$OUTDIR/gpu_bench_configure.log"; exit 1; }
ninja -C build-gpu-app dsv4 > "$OUTDIR/gpu_bench_build.log" 2>&1 || { grep -E "error" "$OUTDIR/gpu_bench_build.log" | head -20; exit 1; }
MODEL=/tmp/flash$LAYERS_N.gguf
[[ -f $MODEL ]] || build-gpu-app/dsv4 synth flash --layers "$LAYERS_N" -o "$MODEL" --vocab byte
for mode in lazy eager; do
  flag=""; [[ $mode == eager ]] && flag="--kv-eager"
  build-gpu-app/dsv4 bench -m "$MODEL" --backend cuda $flag --ctx 1048576 --prompt-file bench/prompts/promessi_sposi.txt \
    --ctx-start 2048 --ctx-max "$CTX_MAX" --step-mul 2 --gen-tokens "$GEN" --csv "$OUTDIR/flash$LAYERS_N-cuda-$mode.csv"
done
build-gpu-app/dsv4 plot "$OUTDIR/flash$LAYERS_N-cuda-lazy.csv" "$OUTDIR/flash$LAYERS_N-cuda-eager.csv" \
  -o "$OUTDIR/flash$LAYERS_N-cuda.svg"
echo "mode,ctx,prefill_tps,gen_tps,kv_committed_MiB,kv_live_MiB"
for mode in lazy eager; do
  tail -n +2 "$OUTDIR/flash$LAYERS_N-cuda-$mode.csv" | awk -F, -v m=$mode '{printf "%s,%s,%s,%s,%.1f,%.1f\n", m,$1,$3,$5,$8/1048576,$9/1048576}'
done
