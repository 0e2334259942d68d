#!/usr/bin/env bash
# One device call: why the fast mode's three largest prompt kernels take the time they take
# (run 152: a fast chunk's routed experts 51 %, its attention 15 %), so that their next form is
# chosen from measurements rather than counts:
#   1. the build and the expert and attention tests;
#   2. Nsight Compute's source counters (stall samples by SASS line, executed instructions by
#      opcode) of attn_rows_f16_kernel in the fast mode on the chunk's ratio-4 layer (the third
#      launch: the default mix is ratios 0, 0, 4, 128) and of the IQ2_XXS gate+up GEMM;
#   3. their sections (speed of light, warp states, pipes, memory) and the Q2_K down GEMM's.
#   run(command="bench/gpu/diag-prefill.sh", carry=[".deps"])
# DIAG_NEW=1: the same for the fast mode's newer kernels instead: attn_rows_fast_kernel (its
# 32-key tiles, the default) unless DIAG_ATTN=0, and gemm_experts_f16_kernel (DSV4_EXPERTS_F16=1):
# its first launch the IQ2_XXS gate+up (source counters, sections), its second the Q2_K down
# (sections).
# About 6 minutes on a fresh machine. Files back: $OUT/*.txt (8 at most).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu/logs}
mkdir -p "$OUT"
mkdir -p /tmp/diag
GTEST_FILTER='*ExpertsPromptOrder*:*Attention*' OUT=/tmp/diag/build scripts/gpu.sh --quick > "/tmp/diag/build.txt" 2>&1
grep -E '^build|error|^tests passed|Failure|first difference' "/tmp/diag/build.txt" | head -8
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DSV4_FAST_PREFILL=1 NCU_STEP=prefill BENCH_TIMEOUT=200 DSV4_BENCH_DECODE=4
SECTIONS="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
--section MemoryWorkloadAnalysis --section Occupancy --section InstructionStats \
--metrics regex:^sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active$,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
smsp__inst_executed.sum,sm__cycles_elapsed.avg"
src() {   # $1 kernel regex, $2 launches to skip, $3 file
  NCU_DETAIL=$1 NCU_SKIP=$2 NCU_SOURCE=1 OUT=/tmp/diag/src scripts/gpu.sh --ncu 2>&1 | grep -v "^==" > "$OUT/$3"
  echo "== source counters: $1 (skip $2)"; head -60 "$OUT/$3"
}
sect() {   # $1 kernel regex, $2 skip, $3 file
  NCU_DETAIL=$1 NCU_SKIP=$2 NCU_COUNT=1 NCU_ALL=1 NCU_LINES=300 NCU_ARGS="$SECTIONS" OUT=/tmp/diag/sect \
    scripts/gpu.sh --ncu > "$OUT/$3" 2>&1
  echo "== sections: $1 (skip $2)"
  grep -E "Duration|Throughput|Issue|Eligible|Stall|Warp Cycles|pct_of_peak|bank_conflicts|wavefronts|inst_executed|Executed Ipc|Pipe|Occupancy" "$OUT/$3" | head -40
}
if [[ "${DIAG_NEW:-0}" == 1 ]]; then
  export DSV4_EXPERTS_F16=1
  [[ "${DIAG_ATTN:-1}" == 1 ]] && src 'attn_rows_fast_kernel' 2 attn_src.txt
  [[ "${DIAG_ATTN:-1}" == 1 ]] && sect 'attn_rows_fast_kernel' 2 attn_sect.txt
  src 'gemm_experts_f16_kernel' 0 xf_src.txt
  sect 'gemm_experts_f16_kernel' 0 xf_gate_sect.txt
  sect 'gemm_experts_f16_kernel' 1 xf_down_sect.txt
else
  src 'attn_rows_f16_kernel' 2 attn_src.txt
  sect 'attn_rows_f16_kernel' 2 attn_sect.txt
  src 'gemm_iq2_smem_kernel' 0 iq2_src.txt
  sect 'gemm_iq2_smem_kernel' 0 iq2_sect.txt
  sect 'gemm_q2k_smem_kernel' 0 q2k_sect.txt
fi
