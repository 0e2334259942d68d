#!/usr/bin/env bash
# One device call for the fast mode's (--fast-prefill's) kernels: the routed 2-bit experts on the
# FP16 tensor cores (gemm_experts_f16_kernel: by Hopper's warpgroup MMA where the device is sm_90,
# WG for rounds of fewer than ~96 pairs an expert, WG2 above; staging only the pairs its MMAs read
# since run 169) and the rows attention in tiles of 32 keys. Each section's output goes to its
# own log under $OUT (nothing lost to the device tool's 12,000-character tail):
#   1. quick.log: the build; the expert test (ExpertsPromptOrderEqualCpuDot: every form within its
#      bounds of the CPU's dots), the attention kernel tests and the fast mode's model tests
#      against the CPU (FastPrefillAtFlashWidth, every variant);
#   2. profiles.log: the group profile of one chunk, 4 layers at 4K (µs a token), under each of
#      $PROFILES (';'-separated settings, each added to DSV4_FAST_PREFILL=1; "-" for the fast
#      mode's defaults);
#   3. with AB=1, ab/: the whole 43-layer model (ab43.sh; 36 layers on an H100, whose ~79 GiB
#      cannot hold all 43) under $AB_SETTINGS; with AB_BEST=1 under the profiles' setting whose
#      experts came out fastest (not a DSV4_XF_DIAG measurement) and the fast defaults; AB_EXTRA:
#      more settings after those;
#   4. with NCU=1, ncu.log: Nsight Compute, the fast chunk's kernels by device time (~90 s); with
#      NCU_SRC=REGEX too, ncu_src.log: the first matching kernel's SASS by stall samples (~60 s).
#   run(command="NCU=1 bench/gpu/fast-round.sh", carry=[".deps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
T0=$(date +%s)
FAST="DSV4_FAST_PREFILL=1"
GTEST_FILTER=${GTEST_FILTER:-'*ExpertsPromptOrder*:*FastPrefill*:CudaKernels.Attention*'} DSV4_CUDA_FLASH=1 \
  OUT=$OUT/tests scripts/gpu.sh --quick > "$OUT/quick.log" 2>&1
echo "== tests ($(( $(date +%s) - T0 )) s): $(grep -E '^tests passed' "$OUT/quick.log")"
grep -E '^\[  FAILED|Failure' "$OUT/quick.log" | head -20
grep -E "^\[cuda-vs-cpu\]" "$OUT/quick.log" | head -12
[[ -d .deps/usr ]] && export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
IFS=';' read -ra LIST <<< "${PROFILES:--;DSV4_XF_WGMMA=2;DSV4_XF_STAGE_USED=0;DSV4_BENCH_PREFILL_CHUNK=4096}"
ARGS=()
for S in "${LIST[@]}"; do [[ "$S" == "-" ]] && ARGS+=("$FAST") || ARGS+=("$FAST $S"); done
bench/gpu/group-profile.sh "${ARGS[@]}" > "$OUT/profiles.log" 2>&1
echo "== profiles ($(( $(date +%s) - T0 )) s): the experts' groups, the attention, out_a and the chunk's total (µs a token)"
grep -E "^== group profile|^experts gate|^experts down|^attention|^out_a|^total|^ctx 1M" "$OUT/profiles.log"
# AB_BEST=1: the whole model under the setting whose experts (gate+up and down, averaged over its
# profiles) came out fastest, DSV4_XF_DIAG measurements left out, then the fast defaults
if [[ "${AB_BEST:-0}" == 1 ]]; then
  BEST=$(awk '/^== group profile/ { s = $0; sub(/^[^:]*: /, "", s); next }
              /^experts gate\+up/ { t[s] += $3; n[s]++ } /^experts down/ { t[s] += $3 }
              END { for (k in t) if (k !~ /DSV4_XF_DIAG/) printf "%.4f %s\n", t[k] / n[k], k }' "$OUT/profiles.log" |
         sort -n | head -1 | cut -d' ' -f2-)
  echo "== fastest experts: ${BEST:-?}"
  AB=1
  AB_SETTINGS=$([[ -z "$BEST" || "$BEST" == "$FAST" ]] && echo "$FAST;-" || echo "$BEST;$FAST")
fi
# AB_EXTRA: more ';'-separated settings for the whole model after those (e.g. decode's switches)
[[ -n "${AB_EXTRA:-}" ]] && AB_SETTINGS="${AB_SETTINGS:--;$FAST};$AB_EXTRA"
if [[ "${AB:-0}" == 1 ]]; then
  OUT=$OUT/ab GTEST_FILTER=None.None AB_TIMEOUT=170 bench/gpu/ab43.sh "${AB_SETTINGS:--;$FAST}"
  grep -E "^== CUDA benchmark|^ctx|kept FP16" "$OUT/ab/ab.log"
fi
if [[ "${NCU:-0}" == 1 ]]; then
  echo "== Nsight Compute, one 2,048-token chunk, fast mode, 4 layers ($(( $(date +%s) - T0 )) s)"
  env $FAST NCU_STEP=prefill NCU_CACHE=none NCU_TESTS=CudaBench.FlashDecodePrefillKv BENCH_TIMEOUT=150 \
    DSV4_BENCH_DECODE=8 OUT=$OUT/ncu scripts/gpu.sh --ncu > "$OUT/ncu.log" 2>&1
  sed -n '/^kernel/,/^total/p' "$OUT/ncu.log" | head -40
fi
if [[ -n "${NCU_SRC:-}" ]]; then
  echo "== Nsight Compute source counters: $NCU_SRC ($(( $(date +%s) - T0 )) s)"
  env $FAST NCU_STEP=prefill NCU_DETAIL="$NCU_SRC" NCU_SOURCE=1 BENCH_TIMEOUT=200 \
    OUT=$OUT/ncu_src scripts/gpu.sh --ncu > "$OUT/ncu_src.log" 2>&1
  grep -A32 "^-- by opcode" "$OUT/ncu_src.log" | head -34
fi
cd "$OUT" && tar czf logs.tgz --remove-files tests ab ncu ncu_src 2>/dev/null
echo "== done ($(( $(date +%s) - T0 )) s)"
