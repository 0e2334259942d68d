#!/usr/bin/env bash
# One device call for the prompt rounds' products through cuBLAS (NOTES, twenty-ninth round):
#   1. every CUDA test (scripts/gpu.sh --quick with the flash-width check), among them
#      CudaVsCpuFastPrefill (the backend option against the CPU) and the two paths' kernel
#      tests (Q8_0CublasFp16WithinBound, FloatCublasFp16WithinBound);
#   2. the products' benchmark (CudaBench.Q8_0PrefillCublasFp16: the five Q8_0 flash products,
#      flat kernel against the cuBLAS path, then the F16 shapes);
#   3. the CudaVsCpu / CudaGreedy tests with every prompt round's F16 products through cuBLAS
#      and the plain FP16 rows attention (DSV4_F16_CUBLAS=1 DSV4_CUBLAS_ROWS=1 DSV4_ATTN_FAST=1:
#      the router's logits in FP16 among them);
#   4. the whole 43-layer model: defaults, the Q8_0 path (--fast-prefill's), with the F16 path,
#      with the plain FP16 attention too.
#   run(command="bench/gpu/fast-prefill.sh", carry=[".deps"])
# About 9 minutes on a fresh machine (the device tool's limit is 10: TEST_TIMEOUT, AB_TIMEOUT).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DSV4_CUDA_FLASH=1 OUT=$OUT/tests TEST_TIMEOUT=${TEST_TIMEOUT:-240} scripts/gpu.sh --quick > "$OUT/quick.log" 2>&1
echo "== tests: $(grep -E '^tests passed' "$OUT/quick.log")"
grep -hE '^\[  FAILED|Failure|worst error|fast prefill' "$OUT/quick.log" "$OUT"/tests/tests.log 2>/dev/null | head -20
DSV4_CUDA_BENCH=1 timeout 120 build-gpu/dsv4_cuda_tests --gtest_filter='CudaBench.Q8_0PrefillCublas*' 2>&1 |
  sed -n '/== Q8_0 prompt products/,/OK \]/p'
DSV4_F16_CUBLAS=1 DSV4_CUBLAS_ROWS=1 DSV4_ATTN_FAST=1 timeout 240 build-gpu/dsv4_cuda_tests \
  --gtest_filter='*CudaVsCpu*:*CudaGreedy*' > "$OUT/f16_vscpu.log" 2>&1
echo "== CudaVsCpu, CudaGreedy with DSV4_F16_CUBLAS=1 DSV4_CUBLAS_ROWS=1 DSV4_ATTN_FAST=1:"
grep -E '^\[cuda|FAILED|Failure|PASSED' "$OUT/f16_vscpu.log" | head -30
F='DSV4_Q8_CUBLAS=1 DSV4_F16_CUBLAS=1'
GTEST_FILTER=None.None AB_TIMEOUT=200 bench/gpu/ab43.sh "-;DSV4_Q8_CUBLAS=1;$F;$F DSV4_ATTN_FAST=1"
