#!/usr/bin/env bash
# One device call for A/B measurements on the whole 43-layer `synth flash` model (36 layers on a
# card of less than ~120 GB: below): every CUDA
# test (scripts/gpu.sh --quick, the flash-width check included), the whole-model tests again
# under TEST_ENV when it is set (switches that change which kernels a captured decode graph
# runs), then the Flash benchmark under each setting of $1 (';'-separated environment
# assignments, "-" for the defaults), each in its own process with an 8K warm-up run first
# (DSV4_BENCH_AB=1: a process's first decode measures ~3 % slower), the 81 GB model
# synthesised once into /dev/shm. Prints one line a setting: prefill and decode tok/s and the
# layers' ms a token at a 1M context holding a 4K conversation (lazy KV).
#   run(command="TEST_ENV='X=1' bench/gpu/ab43.sh '-;X=1;-;X=1'", carry=[".deps"])
# About 3 minutes before the first setting, then ~45 s a setting; keep it under the device
# tool's 10 minutes a command (6 settings fit). For a short budget: DSV4_AB_LAYERS=4 (a
# 4-layer model: per-layer figures, seconds a setting) and GTEST_FILTER (the tests to run).
# AB_TIMEOUT (240 s) bounds each setting: a 256K conversation on 43 layers takes ~190 s a
# setting (two 262,144-token prompts: the warm-up's and the measured one's) and the first
# setting ~80 s more (the synthesis): AB_TIMEOUT=330 and two settings (run 138's first timed out).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
SETTINGS=${1:?"settings: 'A=0;A=1;...' ('-' for the defaults)"}
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
DSV4_CUDA_FLASH=1 OUT=$OUT/tests TEST_TIMEOUT=${TEST_TIMEOUT:-240} scripts/gpu.sh --quick > "$OUT/quick.log" 2>&1
echo "== tests ($(( $(date +%s) - T0 )) s): $(grep -E '^tests passed' "$OUT/quick.log")"
grep -E '^\[  FAILED|Failure' "$OUT/quick.log" | head -20
# (the test binary links the carried libraries; scripts/gpu.sh sets this for itself)
[[ -d .deps/usr ]] && export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ -n "${TEST_ENV:-}" ]]; then
  env $TEST_ENV timeout 240 build-gpu/dsv4_cuda_tests --gtest_filter='*CudaVsCpu*:*CudaConsistency*:*CudaKv*:*CudaGreedy*' > "$OUT/test_env.log" 2>&1
  echo "== whole-model tests with $TEST_ENV ($(( $(date +%s) - T0 )) s): $(grep -c '^\[       OK' "$OUT/test_env.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/test_env.log") failed lines"
  grep -E '^\[  FAILED|Failure' "$OUT/test_env.log" | head -10
fi
# The whole model (80.76 GiB) needs an H200; on a card of less memory (the device tool's H100s:
# ~79 GiB) the most layers that fit with room for the prompt's workspace: 36 (~68 GiB), so the
# settings still compare side by side (per-layer figures: layers ms a token / 36).
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
LAYERS=${DSV4_AB_LAYERS:-$([[ "${GPU_MIB:-0}" -ge 120000 ]] && echo 43 || echo 36)}
echo "== model: $LAYERS layers (GPU memory ${GPU_MIB:-?} MiB)"
MODEL=/dev/shm/flash$LAYERS.gguf
IFS=';' read -ra LIST <<< "$SETTINGS"
printf "%-50s %12s %12s %14s\n" "setting" "prefill t/s" "decode t/s" "layers ms/tok"
for S in "${LIST[@]}"; do
  [[ "$S" == "-" ]] && S=""
  env TMPDIR=/dev/shm DSV4_CUDA_BENCH=1 DSV4_CUDA_TIMING=1 DSV4_BENCH_LAYERS=$LAYERS DSV4_BENCH_DECODE=32 \
      DSV4_BENCH_MODEL=$MODEL DSV4_BENCH_AB=1 $S timeout ${AB_TIMEOUT:-240} build-gpu/dsv4_cuda_tests \
      --gtest_filter='CudaBench.Flash*' > "$OUT/ab.tmp" 2>&1
  cat "$OUT/ab.tmp" >> "$OUT/ab.log"
  line=$(grep -E '^ctx 1M lazy' "$OUT/ab.tmp" | tail -1)
  printf "%-50s %s   (%d s)\n" "${S:-defaults}" "${line:-FAILED: $(tail -2 "$OUT/ab.tmp" | tr '\n' ' ')}" $(( $(date +%s) - T0 ))
done
rm -f "$MODEL" "$OUT/ab.tmp"
