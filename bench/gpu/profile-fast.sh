#!/usr/bin/env bash
# One device call: where a prompt chunk's time goes in --fast-prefill's rounds against the exact
# ones (NOTES, thirtieth round: "Next"), to rank what is left after the fast mode's four parts.
#   1. the build and the prompt-order expert test (ExpertsPromptOrderEqualCpuDot: the IQ2_XXS
#      expansion from the grid as 2-bit codes, DSV4_IQ2_NIB, on by default since run 152, bit for bit
#      against the CPU's dots);
#   2. the group profile of one 2,048-token chunk and of 16 decode steps (events between groups,
#      no graphs; µs a token), 4 layers of the default mix (ratios 0, 0, 4, 128) at 4K: exact,
#      exact with DSV4_IQ2_NIB=0 (the grid's 8-byte rows: its "experts gate+up" line), DSV4_FAST_PREFILL=1, each its own
#      process;
#   3. Nsight Compute: device time by kernel of that chunk in the fast mode (kernel by kernel,
#      caches kept: NCU_CACHE=none).
#   run(command="bench/gpu/profile-fast.sh", carry=[".deps"])
#   4. the whole 43-layer model, exact, with and without DSV4_IQ2_NIB (ab43.sh).
# Run 152 took it with the codes' expansion opt-in (its settings then: "-", DSV4_IQ2_NIB=1).
# About 7 minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
GTEST_FILTER='*ExpertsPromptOrder*' OUT=$OUT/build scripts/gpu.sh --quick > "$OUT/build.log" 2>&1
grep -E '^build|error|^tests passed|Failure|first difference' "$OUT/build.log" | head -8
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bench/gpu/group-profile.sh - "DSV4_IQ2_NIB=0" "DSV4_FAST_PREFILL=1"
echo "== Nsight Compute, one 2,048-token chunk, fast mode, 4 layers"
DSV4_FAST_PREFILL=1 NCU_STEP=prefill NCU_CACHE=none NCU_TESTS=CudaBench.FlashDecodePrefillKv BENCH_TIMEOUT=150 \
  DSV4_BENCH_DECODE=8 OUT=$OUT/ncu scripts/gpu.sh --ncu 2>&1 | sed -n '/^kernel/,/^total/p' | head -40
OUT=$OUT/ab GTEST_FILTER=None.None AB_TIMEOUT=170 bench/gpu/ab43.sh '-;DSV4_IQ2_NIB=0'
