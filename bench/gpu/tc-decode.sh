#!/usr/bin/env bash
# One device call for decode's indexer scores on the tensor cores by the rows' own lengths
# (DSV4_IDX_TC_DECODE=N: rows that see N compressed rows or more; default 16,384 since the
# twenty-seventh round; run 136 compared N = 4,096 with 0, the default then): the indexer and
# consistency tests, then 4 layers all ratio 4 holding a 64K, a 256K and a 16K conversation
# with N = $TC_N (default 4,096) and with 0, then the whole 43-layer model at 64K with the
# default and with 0.
#   run(command="bench/gpu/tc-decode.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
R='DSV4_BENCH_RATIO=4' TC="DSV4_IDX_TC_DECODE=${TC_N:-4096}" OFF='DSV4_IDX_TC_DECODE=0'
C16="$R DSV4_BENCH_CONTEXT=16384" C64="$R DSV4_BENCH_CONTEXT=65536" C256="$R DSV4_BENCH_CONTEXT=262144"
touch src/cuda/*.cu src/cuda/*.cpp tests/cuda/*.cpp
GTEST_FILTER=${GTEST_FILTER:-'*Indexer*:*TopK*:*CudaConsistency*:*CudaVsCpu*'} DSV4_AB_LAYERS=4 \
  bench/gpu/ab43.sh "$C64 $OFF;$C64 $TC;$C256 $OFF;$C256 $TC;$C16 $OFF;$C16 $TC"
[[ -n "${NO_43:-}" ]] && exit 0
OUT=${OUT:-build-gpu/logs}/43 GTEST_FILTER='CudaKernels.NoSuchTest' \
  bench/gpu/ab43.sh "DSV4_BENCH_CONTEXT=65536 $OFF;DSV4_BENCH_CONTEXT=65536"
