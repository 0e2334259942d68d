#!/usr/bin/env bash
# One device call for the long conversation's decode (NOTES, twenty-sixth round): the top-k,
# indexer and whole-model tests, then decode on a 4-layer model whose layers are all ratio 4,
# holding a 64K, a 16K and a 4K conversation, with topk_row's keys staged by cp.async (the
# default since the twenty-sixth round) and a key at a time (DSV4_TOPK_ASYNC=0), and a 256K one
# (65,536 keys a row: past the staging, the filter over staged chunks) against the filter
# walking L2 key by key (DSV4_TOPK_STAGE=0), the scores kernel's 32-key blocks (DSV4_IDX_TILED=2)
# at 64K and 16K, the register top-k (DSV4_TOPK_REG=1) at 64K, 60K, 16K and 4K, then Nsight Compute's sections of topk_select and
# indexer_scores_tiled at 64K. Prints ab43.sh's table (prefill / decode tok/s,
# layers ms a token).
#   run(command="bench/gpu/long-decode.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
R='DSV4_BENCH_RATIO=4'
C16="$R DSV4_BENCH_CONTEXT=16384" C64="$R DSV4_BENCH_CONTEXT=65536" OLD='DSV4_TOPK_ASYNC=0'
C256="$R DSV4_BENCH_CONTEXT=262144"
SETTINGS="$C64;$C64 $OLD;$C16;$C16 $OLD;$R;$R $OLD;$C256;$C256 DSV4_TOPK_STAGE=0;$C64;$C64 $OLD"
SETTINGS+=";$C64 DSV4_IDX_TILED=2;$C16 DSV4_IDX_TILED=2"   # the scores' 32-key blocks
# the register top-k (score matrices up to 32,768 keys wide: 16 keys a thread to 16,384, 32 past
# it; at 4K with the three kernels instead of the fused indexer)
C60="$R DSV4_BENCH_CONTEXT=60000"
SETTINGS+=";$C64 DSV4_TOPK_REG=1;$C60;$C60 DSV4_TOPK_REG=1;$C16 DSV4_TOPK_REG=1;$R DSV4_TOPK_REG=1 DSV4_IDX_FUSED_MAX=0"
touch src/cuda/*.cu src/cuda/*.cpp tests/cuda/*.cpp
GTEST_FILTER=${GTEST_FILTER:-'*TopK*:*Indexer*:*CudaConsistency*:*CudaVsCpu*:*CudaGreedy*'} \
TEST_ENV=${TEST_ENV:-"$OLD DSV4_TOPK_REG=1 DSV4_IDX_TILED=2"} DSV4_AB_LAYERS=${DSV4_AB_LAYERS:-4} \
  bench/gpu/ab43.sh "${1:-$SETTINGS}"
[[ -n "${NO_NCU:-}" ]] && exit 0
# (the first scores call and the first top-k call of a decode step; the whole report in ncu/)
NCU_DETAIL='topk_select|indexer_scores_tiled' NCU_COUNT=2 NCU_CACHE=none DSV4_BENCH_CONTEXT=65536 \
  DSV4_BENCH_LAYERS=4 DSV4_BENCH_RATIO=4 OUT=${OUT:-build-gpu/logs}/ncu scripts/gpu.sh --ncu 2>&1 |
  grep -E "_kernel|Duration|Elapsed Cycles|Registers Per|Warp Cycles Per Issued|Issued Warp|Achieved Occ" | head -20
