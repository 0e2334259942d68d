#!/usr/bin/env bash
# The hunt for an intermittent difference (a race): CudaBench.FlashRepeatsAreBitIdentical (the
# same solo and batched timelines, repeated in one process, each against the first) under each
# setting given, one process a setting, after scripts/gpu.sh has built build-gpu. A setting that
# makes the differences vanish names the mechanism they need.
#
#   bench/gpu/repeats.sh 'X=0' 'DSV4_CUDA_PDL=0' 'DSV4_CUDA_BRANCHES=0' 'DSV4_CUDA_GRAPHS=0'
# Environment: DSV4_BENCH_LAYERS (4), DSV4_BENCH_REPEATS (10), DSV4_BENCH_COMPOSE_STEPS (48),
# DSV4_BENCH_COMPOSE_PROMPT (90), REPEATS_TIMEOUT (seconds a setting, 150).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
source "$ROOT/bench/gpu/deps-env.sh"
export DSV4_CUDA_BENCH=1 DSV4_BENCH_LAYERS=${DSV4_BENCH_LAYERS:-4}
[[ -d /dev/shm ]] && export TMPDIR=${TMPDIR:-/dev/shm}
export DSV4_BENCH_MODEL=${DSV4_BENCH_MODEL:-${TMPDIR:-/tmp}/dsv4-bench-flash-$DSV4_BENCH_LAYERS.gguf}
RC=0
[[ $# -gt 0 ]] || set -- 'X=0'
for setting in "$@"; do
  echo "== $setting"
  env $setting timeout "${REPEATS_TIMEOUT:-150}" "$ROOT/build-gpu/dsv4_cuda_tests" \
    --gtest_filter='CudaBench.FlashRepeatsAreBitIdentical' 2>&1 | grep -E 'repetition|cuda-repeats|FAILED  \]|rror'
  [[ ${PIPESTATUS[0]} == 0 ]] || RC=1
done
exit $RC
