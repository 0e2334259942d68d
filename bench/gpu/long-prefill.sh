#!/usr/bin/env bash
# One device call for long prompts' prefill (NOTES, twenty-eighth round): a long prompt's late
# chunks grow by the ratio-4 layers' indexer scores (1.70 ms a layer a chunk at 64K against
# 0.12 at 4K, run 142) and the ratio-128 layers' attention (2.89 against 0.97 ms). This measures
# two bit-identical switches for them: DSV4_IDX_TC_ROWS=32 (each block of the tensor-core
# scores takes 32 query rows instead of 16: every 256-key block staged half as often) and
# DSV4_TOPK_CLUSTER=2 (a prompt round's rows past 32,768 keys by the top-k's clusters too).
#   1. the top-k and indexer tests (the 70-row round by clusters; the scores by 32, 5 and 1 rows
#      a block) and the consistency tests;
#   2. 4 layers, every layer ratio 4: prefill tok/s of a 64K and a 256K prompt under each setting
#      (ab43.sh's table: prefill / decode tok/s, layers ms a token);
#   3. Nsight Compute: the durations of the indexer scores, the top-k and the attention of one
#      2,048-token chunk at the end of a 256K prompt, defaults and both switches.
# LONG43=1 also runs the whole 43-layer model on a 64K prompt, defaults and both switches (two
# more minutes: a second call if the first ran long).
#   run(command="bench/gpu/long-prefill.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
R='DSV4_BENCH_RATIO=4' BOTH='DSV4_IDX_TC_ROWS=32 DSV4_TOPK_CLUSTER=2'
C64="$R DSV4_BENCH_CONTEXT=65536" C256="$R DSV4_BENCH_CONTEXT=262144"
SETTINGS="$C64;$C64 $BOTH;$C256;$C256 DSV4_IDX_TC_ROWS=32;$C256 DSV4_TOPK_CLUSTER=2;$C256 $BOTH"
GTEST_FILTER=${GTEST_FILTER:-'*TopK*:*IndexerTensorCore*:*CudaConsistency*'} DSV4_AB_LAYERS=4 AB_TIMEOUT=120 \
  bench/gpu/ab43.sh "${1:-$SETTINGS}"
# (scripts/gpu.sh's Nsight sections, squeezed to a kernel's name, its grid and its duration a
# line; 4 layers: a call a layer)
for S in "" "$BOTH"; do
  echo "== Nsight Compute, the last chunk of a 256K prompt, 4 ratio-4 layers: ${S:-defaults}"
  env $C256 $S NCU_STEP=prefill NCU_DETAIL='indexer_scores_tc|topk|attn' NCU_COUNT=6 NCU_ARGS='--section SpeedOfLight' \
    NCU_TESTS=CudaBench.FlashDecodePrefillKv NCU_CACHE=none BENCH_TIMEOUT=150 DSV4_BENCH_LAYERS=4 DSV4_BENCH_DECODE=8 \
    OUT=${OUT:-build-gpu/logs}/ncu${S:+-both} scripts/gpu.sh --ncu 2>&1 |
    grep -E "^  [a-z_v]|Duration" | sed -E 's/\(const.*\) \(/ (/; s/, Context.*//' | paste - - | awk '{$1=$1};1' | cut -c1-150
done
[[ -z "${LONG43:-}" ]] && exit 0
AB_TIMEOUT=300 GTEST_FILTER='None.None' bench/gpu/ab43.sh "DSV4_BENCH_CONTEXT=65536;DSV4_BENCH_CONTEXT=65536 $BOTH"
