#!/usr/bin/env bash
# One device call for the prompt rounds' fast mode and the F16 products (NOTES, thirtieth round):
#   1. every CUDA test (scripts/gpu.sh --quick with the flash-width checks), among them
#      CudaVsCpuFastPrefill / CudaVsCpuFlash.FastPrefillAtFlashWidth (--fast-prefill against the
#      CPU: each part's path taken), the paths' kernel tests (Q8_0CublasFp16WithinBound,
#      FloatCublasFp16WithinBound, the attention tests' mode 5, the mHC tests' float mix) and
#      the flat F16 kernel's blocks of 32 rows (FloatWeightFlatOrderOnTensorCores: the same bits);
#   2. the products' benchmark (CudaBench.Q8_0PrefillCublasFp16: the five Q8_0 flash products,
#      flat kernel against the cuBLAS path, then the four F16 shapes: 128-row blocks, the
#      default's, cuBLAS);
#   3. the whole 43-layer model: defaults, the flat F16 kernel's 128-row blocks alone
#      (DSV4_FLAT_FLOAT_NT=4), DSV4_FAST_PREFILL=1 (--fast-prefill), and the fast mode without
#      its float mHC mix (DSV4_HC_FAST=0);
#   4. Nsight Compute: device time by kernel of 2 decode steps on 4 layers (where decode goes).
#   run(command="bench/gpu/fast-prefill.sh", carry=[".deps"])
# About 8–9 minutes on a fresh machine (the device tool's limit is 10: TEST_TIMEOUT, AB_TIMEOUT).
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
OUT=$OUT/ab GTEST_FILTER=None.None AB_TIMEOUT=200 bench/gpu/ab43.sh "-;DSV4_FLAT_FLOAT_NT=4;$F;$F DSV4_HC_FAST=0"
OUT=$OUT/ncu timeout 110 scripts/gpu.sh --ncu 2>&1 | grep -vE '^(== machine|commit|Build|cmake|name,|NVIDIA)' | tail -45
