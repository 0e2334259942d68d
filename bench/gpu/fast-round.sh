#!/usr/bin/env bash
# One device call for the fast mode's (--fast-prefill's) newer kernels, its defaults since
# runs 155-164 (H100): the routed 2-bit experts on the FP16 tensor cores (gemm_experts_f16_kernel:
# Q2_K down since run 157, IQ2_XXS gate+up since run 158, both by Hopper's warpgroup MMA since
# run 164; DSV4_EXPERTS_F16=0 for the exact kernels, DSV4_XF_IQ2=0 for the gate+up's alone,
# DSV4_XF_WGMMA=0 for mma.sync) and the rows attention in tiles of 32 keys (attn_rows_fast_kernel;
# DSV4_ATTN_FAST_KT=16 for the kernel before):
#   1. the build; the expert test (ExpertsPromptOrderEqualCpuDot: the FP16 kernel within its
#      bounds of the CPU's dots), every attention kernel test (mode 6: the 32-key tiles against
#      the double reference, alone = batched, the fold, the codes) and the fast mode's model
#      tests against the CPU (FastPrefillAtFlashWidth: either attention, either experts kernel);
#   2. the whole 43-layer model (ab43.sh; 36 layers on an H100, whose ~79 GiB cannot hold all
#      43): exact defaults, the fast mode, it in rounds of 4,096 tokens (the experts' WG2 form
#      there by default, run 168), it staging only the pairs the experts' MMAs read
#      (DSV4_XF_STAGE_USED=1, opt-in, not yet run);
#   3. the group profile of one chunk, 4 layers at 4K (µs a token): the fast mode; it with
#      DSV4_XF_STAGE_USED=1; that with WG2 (DSV4_XF_WGMMA=2); a round of 4,096 (WG2); that with
#      DSV4_XF_STAGE_USED=1; that with WG;
#   4. with NCU=1, Nsight Compute: the fast chunk's kernels by device time (~90 s more).
#   run(command="bench/gpu/fast-round.sh 2>&1 | tail -80", carry=[".deps"], timeout_s=600)
# About 5 minutes on a fresh H100 without NCU (the 43 layers of an H200: ~8).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
FAST="DSV4_FAST_PREFILL=1"
R4096="DSV4_BENCH_PREFILL_CHUNK=4096"
OUT=$OUT/ab GTEST_FILTER='*ExpertsPromptOrder*:*FastPrefill*:CudaKernels.Attention*' AB_TIMEOUT=170 \
  bench/gpu/ab43.sh "${AB_SETTINGS:--;$FAST;$FAST $R4096;$FAST DSV4_XF_STAGE_USED=1}"
grep -E "max rel|median|argmax|bound" "$OUT/ab/quick.log" | head -12
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SU=DSV4_XF_STAGE_USED=1
bench/gpu/group-profile.sh "$FAST" "$FAST $SU" "$FAST $SU DSV4_XF_WGMMA=2" "$FAST $R4096" "$FAST $R4096 $SU" \
  "$FAST $R4096 DSV4_XF_WGMMA=1"
if [[ "${NCU:-0}" == 1 ]]; then
  echo "== Nsight Compute, one 2,048-token chunk, fast mode, 4 layers"
  env $FAST NCU_STEP=prefill NCU_CACHE=none NCU_TESTS=CudaBench.FlashDecodePrefillKv BENCH_TIMEOUT=150 \
    DSV4_BENCH_DECODE=8 OUT=$OUT/ncu scripts/gpu.sh --ncu 2>&1 | sed -n '/^kernel/,/^total/p' | head -30
fi
