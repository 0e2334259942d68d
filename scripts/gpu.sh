#!/usr/bin/env bash
# The one GPU script: on the machine with the GPU, configures and builds the CUDA backend
# (Release, sm_90), runs every CUDA test (kernels vs the CPU reference, whole-model logits
# vs the CPU backend, greedy continuations, prefill = decode, lazy = eager, the guard), the
# flash-width expert-mix check and the benchmarks, and prints a summary table last.
# Logs go under $OUT when it is set (the device tool's result folder), else build-gpu/logs.
#
#   scripts/gpu.sh                 everything
#   scripts/gpu.sh --quick         tests only (no flash-width check, no benchmark)
#   GTEST_FILTER=... scripts/gpu.sh  a subset of the tests
# Environment: DSV4_BENCH_LAYERS (4), DSV4_BENCH_CONTEXT (4096), DSV4_BENCH_DECODE (64),
# DSV4_GPU_LAYERS (library layers to build; default: what the CUDA tests need).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
LOG=${OUT:-$ROOT/build-gpu/logs}
mkdir -p "$LOG"
BUILD=$ROOT/build-gpu
T0=$(date +%s)

# Development packages the image may lack (pcre2, xxhash, nlohmann-json, gtest, pkg-config)
# can travel in .deps/usr (see bench/gpu/NOTES.md for how it is made).
if [[ -d .deps/usr ]]; then
  export PATH=$ROOT/.deps/usr/bin:$PATH
  export LD_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$ROOT/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
fi

{
  echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  echo "commit $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  nvcc --version 2>&1 | tail -1; cmake --version | head -1
} 2>&1 | tee "$LOG/machine.txt"

LAYERS=${DSV4_GPU_LAYERS:-"common;quant;gguf;model;kv;cpu"}
echo "== configure + build ($LAYERS)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDSV4_CUDA=ON \
      "-DDSV4_LAYERS=$LAYERS" > "$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; exit 1; }
TB=$(date +%s)
ninja -C "$BUILD" dsv4_cuda_tests > "$LOG/build.log" 2>&1 || { grep -E "error|FAILED" "$LOG/build.log" | head -40; tail -20 "$LOG/build.log"; exit 1; }
echo "build $(( $(date +%s) - TB )) s; warnings: $(grep -c 'warning' "$LOG/build.log")"

export DSV4_CUDA_TIMING=1
if [[ $QUICK == 0 ]]; then export DSV4_CUDA_FLASH=1 DSV4_CUDA_BENCH=1; fi
echo "== tests"
FILTER=${GTEST_FILTER:-*}
SHOW='^\[( +OK|  FAILED|  SKIPPED) |Failure|rror|^\[cuda|Expected|Which is|actual|^== |^(run|ctx|per layer|full|model file)'
timeout ${TEST_TIMEOUT:-480} "$BUILD/dsv4_cuda_tests" --gtest_filter="$FILTER:-CudaBench.*" 2>&1 | tee "$LOG/tests.log" | grep -E "$SHOW"
RC=${PIPESTATUS[0]}
if [[ $QUICK == 0 && "$FILTER" == "*" ]]; then
  echo "== benchmarks"
  timeout ${BENCH_TIMEOUT:-300} "$BUILD/dsv4_cuda_tests" --gtest_filter="CudaBench.*" 2>&1 | tee -a "$LOG/tests.log" | grep -E "$SHOW"
  [[ ${PIPESTATUS[0]} == 0 ]] || RC=1
fi

echo
echo "================================ summary ================================"
printf "%-60s %s\n" "tests passed / failed / skipped" \
  "$(grep -c '^\[       OK' "$LOG/tests.log") / $(grep -c '^\[  FAILED  \] [A-Za-z]' "$LOG/tests.log" | awk '{print int($1/2)}') / $(grep -c '^\[  SKIPPED \] [A-Za-z]' "$LOG/tests.log" | awk '{print int($1/2)}')"
grep -E '^\[cuda-(vs-cpu|greedy|kv)\]' "$LOG/tests.log" | sed 's/^/  /'
sed -n '/== CUDA benchmark/,/full 43-layer/p' "$LOG/tests.log"
echo "total $(( $(date +%s) - T0 )) s; logs in $LOG; exit $RC"
exit $RC
