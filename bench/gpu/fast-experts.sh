#!/usr/bin/env bash
# One device call: the fast mode's routed experts on the FP16 tensor cores (DSV4_EXPERTS_F16,
# gemm_experts_f16_kernel; part of --fast-prefill):
#   1. the build, the expert test (ExpertsPromptOrderEqualCpuDot: the FP16 kernel within its
#      bounds of the CPU's dots) and the fast mode's model tests against the CPU (flash widths);
#   2. the whole 43-layer model (ab43.sh): exact defaults, the fast mode, the fast mode without
#      the FP16 experts;
#   3. the group profile of one 2,048-token chunk, 4 layers at 4K (µs a token): the fast mode with
#      and without the FP16 experts;
#   4. Nsight Compute: the fast chunk's kernels by device time.
#   run(command="bench/gpu/fast-experts.sh", carry=[".deps"])
# About 8 minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
OUT=$OUT/ab GTEST_FILTER='*ExpertsPromptOrder*:*FastPrefill*' AB_TIMEOUT=170 \
  bench/gpu/ab43.sh "${AB_SETTINGS:--;DSV4_FAST_PREFILL=1;DSV4_FAST_PREFILL=1 DSV4_EXPERTS_F16=0}"
grep -E "max rel|median|argmax|bound" "$OUT/ab/quick.log" | head -12
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bench/gpu/group-profile.sh "DSV4_FAST_PREFILL=1" "DSV4_FAST_PREFILL=1 DSV4_EXPERTS_F16=0"
echo "== Nsight Compute, one 2,048-token chunk, fast mode, 4 layers"
DSV4_FAST_PREFILL=1 NCU_STEP=prefill NCU_CACHE=none NCU_TESTS=CudaBench.FlashDecodePrefillKv BENCH_TIMEOUT=150 \
  DSV4_BENCH_DECODE=8 OUT=$OUT/ncu scripts/gpu.sh --ncu 2>&1 | sed -n '/^kernel/,/^total/p' | head -30
