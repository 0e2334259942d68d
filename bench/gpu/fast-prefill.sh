#!/usr/bin/env bash
# One device call for --fast-prefill (NOTES, thirtieth round):
#   1. every CUDA test (scripts/gpu.sh --quick with the flash-width checks), among them
#      CudaVsCpuFastPrefill / CudaVsCpuFlash.FastPrefillAtFlashWidth (the backend option against
#      the CPU: each part's path taken) and the paths' kernel tests (Q8_0CublasFp16WithinBound,
#      FloatCublasFp16WithinBound, the attention tests' mode 5);
#   2. the products' benchmark (CudaBench.Q8_0PrefillCublasFp16: the five Q8_0 flash products,
#      flat kernel against the cuBLAS path, then the four F16 shapes);
#   3. the whole 43-layer model: defaults, DSV4_FAST_PREFILL=1 (--fast-prefill), and the fast
#      mode without its F16 products' path, then without its attention's.
#   run(command="bench/gpu/fast-prefill.sh", carry=[".deps"])
# About 7 minutes on a fresh machine (the device tool's limit is 10: TEST_TIMEOUT, AB_TIMEOUT).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DSV4_CUDA_FLASH=1 OUT=$OUT/tests TEST_TIMEOUT=${TEST_TIMEOUT:-240} scripts/gpu.sh --quick > "$OUT/quick.log" 2>&1
echo "== tests: $(grep -E '^tests passed' "$OUT/quick.log")"
grep -hE '^\[  FAILED|Failure|worst error|fast prefill' "$OUT/quick.log" "$OUT"/tests/tests.log 2>/dev/null | awk '!seen[$0]++' | head -20
DSV4_CUDA_BENCH=1 timeout 120 build-gpu/dsv4_cuda_tests --gtest_filter='CudaBench.Q8_0PrefillCublas*' 2>&1 |
  sed -n '/== Q8_0 prompt products/,/OK \]/p'
F=DSV4_FAST_PREFILL=1
OUT=$OUT/ab GTEST_FILTER=None.None AB_TIMEOUT=200 bench/gpu/ab43.sh "-;$F;$F DSV4_F16_CUBLAS=0;$F DSV4_ATTN_FAST=0"
