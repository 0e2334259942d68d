#!/usr/bin/env bash
# One device call for the longest conversations' decode (NOTES, twenty-seventh round): the
# top-k and indexer tests (form 9 of TopKTiesGoToTheLowerIndex: the top-k of rows up to 262,144
# keys by clusters of 2, 4 or 8 blocks), then decode on a 4-layer model whose layers are all
# ratio 4 holding a 128K, a 256K and a 1M conversation (32K, 64K and 250K keys a row) with the
# clusters (the default since run 137) and without (DSV4_TOPK_CLUSTER=0: topk_select_kernel's
# filter over staged chunks past 32,768 keys), and a 64K one as the reference, then Nsight
# Compute's sections of the top-k at 256K with the clusters. Prints ab43.sh's table (prefill /
# decode tok/s, layers ms a token).
# (Runs 128-134 used this script for the staging, the filter and the register top-k, run 137
# for the clusters: their settings are in bench/RESULTS.md §5.20-5.22.)
#   run(command="bench/gpu/long-decode.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
R='DSV4_BENCH_RATIO=4' CL='DSV4_TOPK_CLUSTER=0'
C64="$R DSV4_BENCH_CONTEXT=65536" C128="$R DSV4_BENCH_CONTEXT=131072" C256="$R DSV4_BENCH_CONTEXT=262144"
C1M="$R DSV4_BENCH_CONTEXT=1000000"
SETTINGS="$C64;$C128;$C128 $CL;$C256;$C256 $CL;$C1M;$C1M $CL"
touch src/cuda/*.cu src/cuda/*.cpp tests/cuda/*.cpp
GTEST_FILTER=${GTEST_FILTER:-'*TopK*:*Indexer*:*CudaConsistency*'} DSV4_AB_LAYERS=${DSV4_AB_LAYERS:-4} \
  bench/gpu/ab43.sh "${1:-$SETTINGS}"
[[ -n "${NO_NCU:-}" ]] && exit 0
# (the first scores call and the first top-k call of a decode step; the whole report in ncu/)
NCU_DETAIL='topk_reg|indexer_scores_tc' NCU_COUNT=2 NCU_CACHE=none DSV4_BENCH_CONTEXT=262144 \
  DSV4_BENCH_LAYERS=4 DSV4_BENCH_RATIO=4 OUT=${OUT:-build-gpu/logs}/ncu scripts/gpu.sh --ncu 2>&1 |
  grep -E "_kernel|Duration|Elapsed Cycles|Registers Per|Warp Cycles Per Issued|Issued Warp|Achieved Occ" | head -20
