#!/usr/bin/env bash
# The group profile of one 2,048-token chunk and of 16 decode steps (events between groups, no
# graphs; µs a token), 4 layers of the default mix (ratios 0, 0, 4, 128) at 4K, under each
# setting given ("-": the defaults), each its own process. Needs build-gpu (scripts/gpu.sh).
#   bench/gpu/group-profile.sh - DSV4_FAST_PREFILL=1
# GP_TIMEOUT: seconds a setting may take (150; a hung kernel costs no more)
cd "$(dirname "$0")/../.."
[[ -d .deps/usr ]] && export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for S in "$@"; do
  echo "== group profile, 4 layers at 4K: ${S/#-/exact (defaults)}"
  [[ "$S" == "-" ]] && S=""
  env TMPDIR=/dev/shm DSV4_CUDA_BENCH=1 DSV4_CUDA_TIMING=1 DSV4_BENCH_LAYERS=4 DSV4_BENCH_DECODE=16 $S \
    timeout ${GP_TIMEOUT:-150} build-gpu/dsv4_cuda_tests --gtest_filter=CudaBench.FlashDecodePrefillKv 2>&1 |
    sed -n '/== prefill (one/,/^total/p;/^ctx 1M lazy/p'
done
