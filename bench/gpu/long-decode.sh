#!/usr/bin/env bash
# One device call for the long conversation's decode (NOTES, twenty-fifth round): the top-k,
# indexer and whole-model tests, the whole-model tests again under the prepared switches, then
# decode on a 4-layer model whose layers are all ratio 4, holding a 60K conversation (the fused
# indexer: 15,008 keys a row) and a 64K one (the three kernels: 16,385 keys and more), under
# each setting, and a 4K one for reference. Prints ab43.sh's table (prefill / decode tok/s,
# layers ms a token).
#   run(command="bench/gpu/long-decode.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
R='DSV4_BENCH_RATIO=4'
C60="$R DSV4_BENCH_CONTEXT=60000" C64="$R DSV4_BENCH_CONTEXT=65536"
NEW='DSV4_TOPK_WARP=1 DSV4_TOPK_FILTER=1'
SETTINGS="$C64;$C64 DSV4_TOPK_WARP=1;$C64 $NEW;$C64 $NEW DSV4_IDX_TC_DECODE=16384"
SETTINGS+=";$C60;$C60 $NEW;$C60 $NEW DSV4_IDX_FUSED_TILES=0;$C60 $NEW DSV4_IDX_FUSED_MAX=4096"
SETTINGS+=";$R;$R DSV4_IDX_FUSED_TILES=2;$R DSV4_IDX_FUSED_TILES=4;$R"   # 4K: 1,024 keys, 64 fused blocks
touch src/cuda/*.cu src/cuda/*.cpp tests/cuda/*.cpp
GTEST_FILTER=${GTEST_FILTER:-'*TopK*:*Indexer*:*CudaConsistency*:*CudaVsCpu*:*CudaGreedy*'} \
TEST_ENV=${TEST_ENV:-"$NEW DSV4_IDX_FUSED_TILES=2"} DSV4_AB_LAYERS=${DSV4_AB_LAYERS:-4} \
  bench/gpu/ab43.sh "${1:-$SETTINGS}"
