#!/usr/bin/env bash
# The one GPU script: on the machine with the GPU, configures and builds the CUDA backend
# (Release, sm_90), runs every CUDA test (kernels vs the CPU reference, whole-model logits
# vs the CPU backend, greedy continuations, prefill = decode, lazy = eager, the guard), the
# flash-width expert-mix check, the benchmarks and `dsv4 serve` over HTTP (bench/gpu/serve.sh),
# and prints a summary table last.
# Logs go under $OUT when it is set (the device tool's result folder), else build-gpu/logs.
#
#   scripts/gpu.sh                 everything
#   scripts/gpu.sh --quick         tests only (no flash-width check, no benchmark)
#   GTEST_FILTER=... scripts/gpu.sh  a subset of the tests
#   GPU_AB="X=0;X=1" scripts/gpu.sh  + the Flash benchmark under each setting (A/B)
#   scripts/gpu.sh --build         configure and build the test binary only, and keep it in
#                                  .prebuilt/ for the device (no GPU needed: bench/gpu/prebuilt.sh
#                                  make runs it here)
# Tests-only and --ncu runs take the test binary carried in .prebuilt/ (bench/gpu/prebuilt.sh)
# instead of building it, when it was built from these very sources.
# Environment: DSV4_BENCH_LAYERS (4; 43 = the whole Flash model, ~81 GB, synthesised into
# /dev/shm in ~60 s, once for the benchmark and its A/B runs), DSV4_BENCH_RATIO (every layer
# of one compression ratio), DSV4_BENCH_CONTEXT (4096), DSV4_BENCH_DECODE (64),
# DSV4_GPU_LAYERS (library layers to build; default: what the CUDA tests need).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
QUICK=0
NCU=0
BUILD_ONLY=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
[[ "${1:-}" == "--ncu" ]] && NCU=1
[[ "${1:-}" == "--build" ]] && BUILD_ONLY=1
LOG=${OUT:-$ROOT/build-gpu/logs}
mkdir -p "$LOG"
BUILD=$ROOT/build-gpu
T0=$(date +%s)

# Development packages the image may lack (pcre2, xxhash, nlohmann-json, gtest, pkg-config)
# can travel in .deps/usr (see bench/gpu/NOTES.md for how it is made).
source "$ROOT/bench/gpu/deps-env.sh"

{
  echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  echo "commit $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  nvcc --version 2>&1 | tail -1; cmake --version | head -1
} 2>&1 | tee "$LOG/machine.txt"

LAYERS=${DSV4_GPU_LAYERS:-"common;quant;gguf;model;kv;cpu"}
echo "== configure + build ($LAYERS)"
if [[ $QUICK == 1 || $NCU == 1 ]] && "$ROOT/bench/gpu/prebuilt.sh" use "$BUILD" "$LAYERS"; then
  echo "build: the carried .prebuilt/dsv4_cuda_tests (built from these sources: bench/gpu/prebuilt.sh)"
else
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDSV4_CUDA=ON \
        "-DDSV4_LAYERS=$LAYERS" > "$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; exit 1; }
  TB=$(date +%s)
  ninja -C "$BUILD" dsv4_cuda_tests > "$LOG/build.log" 2>&1 || { grep -E "error|FAILED" "$LOG/build.log" | head -40; tail -20 "$LOG/build.log"; exit 1; }
  echo "build $(( $(date +%s) - TB )) s; warnings: $(grep -c 'warning' "$LOG/build.log")"
fi
[[ $BUILD_ONLY == 1 ]] && exec "$ROOT/bench/gpu/prebuilt.sh" keep "$BUILD" "$LAYERS"

# --ncu: Nsight Compute times every kernel of 2 decode steps (4,096-token context, no graphs,
# so no launch gaps in the numbers), then a table of device time per token by kernel.
# NCU_CACHE=none keeps the caches warm between kernels (as in a real decode step: small
# activations stay in L2); the default flushes them before each kernel.
# NCU_STEP=prefill (with --ncu): the kernels of one 2,048-token prefill chunk instead of 2
# decode steps (per token = per call / 2,048 in the table).
# NCU_DETAIL=REGEX (with --ncu): instead of the per-kernel table, Nsight Compute's sections
# (speed of light, occupancy, warp stalls, memory) for the first NCU_COUNT (8) kernels (of the
# decode steps, or of the prefill chunk) whose names match REGEX: why a kernel takes the time
# it takes. NCU_ARGS replaces those sections (e.g. --metrics regex:...); NCU_TESTS the benchmarks
# run under it (CudaBench.Flash*; CudaBench.FlashDecodePrefillKv alone for a long context).
# NCU_SKIP=N (with NCU_DETAIL): skip the first N matching launches (e.g. 2: a chunk's third
# layer, the default mix's ratio-4 one); NCU_ALL=1: print every line of the sections.
# NCU_SOURCE=1 (with NCU_DETAIL): the first matching kernel's SASS instruction by instruction
# instead (Nsight Compute's source counters: instructions executed and warp stall samples a
# SASS line): the 40 lines with the most stall samples, and the executed instructions and
# samples by opcode. The report stays in $LOG/ncu_src.ncu-rep, the table in ncu_source.csv.
[[ $NCU == 1 ]] && NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ $NCU == 1 && -n "${NCU_DETAIL:-}" && -n "${NCU_SOURCE:-}" ]]; then
  DSV4_CUDA_BENCH=1 DSV4_NCU=${NCU_STEP:-1} DSV4_BENCH_DECODE=${DSV4_BENCH_DECODE:-8} \
    timeout ${BENCH_TIMEOUT:-300} "$NCU_BIN" --profile-from-start off --clock-control none \
    --cache-control "${NCU_CACHE:-none}" -k "regex:$NCU_DETAIL" -c 1 ${NCU_SKIP:+--launch-skip $NCU_SKIP} --section SourceCounters \
    --section WarpStateStats --import-source no -f -o "$LOG/ncu_src" \
    "$BUILD/dsv4_cuda_tests" --gtest_filter="CudaBench.FlashDecodePrefillKv" > "$LOG/ncu_src_app.log" 2>&1
  echo "ncu rc $?"
  "$NCU_BIN" -i "$LOG/ncu_src.ncu-rep" --page source --csv --print-source sass > "$LOG/ncu_source.csv" 2>&1
  echo "ncu source page rc $?"
  python3 - "$LOG/ncu_source.csv" <<'PY'
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
h = next((i for i, r in enumerate(rows) if any(c.strip() in ("Source", "Address") for c in r)), None)
if h is None:
    print("no source table; the file begins:"); [print(",".join(r)[:200]) for r in rows[:15]]; sys.exit(0)
hdr = [c.strip() for c in rows[h]]
print("columns:", " | ".join(hdr)[:600])
def col(*pats):
    for p in pats:
        for i, c in enumerate(hdr):
            if re.search(p, c, re.I): return i
    return None
src = col(r"^Source$")
samp = col(r"Warp Stall Sampling \(All", r"Stall Sampling", r"Sampling")
ex = col(r"^Instructions Executed", r"Warp.*Instructions Executed", r"Instructions Executed")
num = lambda r, i: float(r[i].replace(",", "")) if i is not None and i < len(r) and re.match(r"^-?[\d.,]+$", r[i].strip() or "x") else 0.0
body = [r for r in rows[h + 1:] if src is not None and len(r) > src and r[src].strip()]
ts, te = sum(num(r, samp) for r in body), sum(num(r, ex) for r in body)
print(f"{len(body)} SASS lines, {te:.0f} warp instructions executed, {ts:.0f} stall samples")
print("-- the 40 lines with the most samples (samples, share, executed, SASS)")
for r in sorted(body, key=lambda r: -num(r, samp))[:40]:
    print(f"{num(r, samp):9.0f} {100 * num(r, samp) / max(ts, 1):5.1f}% {num(r, ex):12.0f}  {r[src].strip()[:90]}")
ops = collections.defaultdict(lambda: [0.0, 0.0])
for r in body:
    op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0]
    ops[op][0] += num(r, ex); ops[op][1] += num(r, samp)
print("-- by opcode (executed share, sample share)")
for op, (e, s_) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"{op:24s} {100 * e / max(te, 1):6.1f}% {100 * s_ / max(ts, 1):6.1f}%")
PY
  exit 0
fi
if [[ $NCU == 1 && -n "${NCU_DETAIL:-}" ]]; then
  DSV4_CUDA_BENCH=1 DSV4_NCU=${NCU_STEP:-1} DSV4_BENCH_DECODE=${DSV4_BENCH_DECODE:-8} timeout ${BENCH_TIMEOUT:-300} \
    "$NCU_BIN" --profile-from-start off --clock-control none --cache-control "${NCU_CACHE:-none}" \
    -k "regex:$NCU_DETAIL" -c "${NCU_COUNT:-8}" ${NCU_SKIP:+--launch-skip $NCU_SKIP} ${NCU_ARGS:---section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats} \
    "$BUILD/dsv4_cuda_tests" --gtest_filter="${NCU_TESTS:-CudaBench.Flash*}" > "$LOG/ncu_detail.txt" 2>&1
  echo "ncu rc $?"
  [[ -n "${NCU_ALL:-}" ]] && { grep -vE "^ *(----|==PROF==)|^\[" "$LOG/ncu_detail.txt" | head -${NCU_LINES:-400}; exit 0; }
  grep -vE "^ *(----|==PROF==)" "$LOG/ncu_detail.txt" | grep -E "^  [a-z_]|Duration|Throughput|Occupancy|Registers|Block Size|Grid Size|Waves|Stall|Warp Cycles|Eligible|Issued|Shared Memory Config|Dynamic Shared|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|One or More|No Eligible|Active Warps|Theoretical" | head -${NCU_LINES:-400}
  exit 0
fi
if [[ $NCU == 1 ]]; then
  echo "== ncu: $NCU_BIN"
  DSV4_CUDA_BENCH=1 DSV4_NCU=${NCU_STEP:-1} DSV4_BENCH_DECODE=${DSV4_BENCH_DECODE:-8} timeout ${BENCH_TIMEOUT:-300} \
    "$NCU_BIN" --profile-from-start off --clock-control none --cache-control "${NCU_CACHE:-all}" \
    --metrics gpu__time_duration.sum --csv --page raw \
    --log-file "$LOG/ncu.csv" "$BUILD/dsv4_cuda_tests" --gtest_filter="CudaBench.*" > "$LOG/ncu_app.log" 2>&1
  echo "ncu rc $?"; grep -E "^(run|ctx|per layer)" "$LOG/ncu_app.log"
  NCU_TOKENS=2; [[ "${NCU_STEP:-1}" == prefill ]] && NCU_TOKENS=2048
  python3 - "$LOG/ncu.csv" "$NCU_TOKENS" <<'PY'
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
hdr, unit = rows[h], rows[h + 1]
kn, tc = hdr.index('Kernel Name'), hdr.index('gpu__time_duration.sum')
scale = {'nsecond': 1e-3, 'ns': 1e-3, 'usecond': 1.0, 'us': 1.0, 'msecond': 1e3, 'ms': 1e3}[unit[tc]]
agg = collections.defaultdict(lambda: [0.0, 0])
for r in rows[h + 2:]:
    if len(r) <= max(kn, tc) or not r[tc]: continue
    name = r[kn].replace('(anonymous namespace)::', '').replace('dsv4::cuda::', '').replace('<unnamed>::', '')
    name = re.sub(r'^void ', '', re.sub(r'\([^()]*\)$', '', name)).split('unnamed>::')[-1]
    agg[name][0] += float(r[tc].replace(',', '')) * scale
    agg[name][1] += 1
tot = sum(v[0] for v in agg.values())
ntok = int(sys.argv[2])
what = '2 decode steps' if ntok == 2 else f'a {ntok}-token prefill chunk'
print(f"{'kernel (' + what + ', per token)':70s} {'us/tok':>8s} {'calls/tok':>9s} {'us/call':>8s} {'share':>6s}")
for k, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:40]:
    print(f"{k[:70]:70s} {t/ntok:8.2f} {c/ntok:9.3f} {t/c:8.2f} {100*t/tot:5.1f}%")
print(f"total kernel time {tot/ntok:.2f} us/token, {sum(v[1] for v in agg.values())} kernels in all")
PY
  exit 0
fi

export DSV4_CUDA_TIMING=1
# The full 43-layer model (DSV4_BENCH_LAYERS=43) is an 81 GB file: more than the GPU machine's
# 64 GB disk, less than its 128 GB /dev/shm, so the benchmark's synthesised models go there.
if [[ -z "${TMPDIR:-}" && -d /dev/shm ]] && (( $(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9) > 100 )); then
  export TMPDIR=/dev/shm
fi
if [[ $QUICK == 0 ]]; then export DSV4_CUDA_FLASH=1 DSV4_CUDA_BENCH=1; fi
# The benchmark's model is synthesised once and shared by the benchmark and every A/B run
# (DSV4_BENCH_RATIO=0|4|128: every layer of one kind; see cuda_bench_test.cpp).
export DSV4_BENCH_MODEL=${DSV4_BENCH_MODEL:-${TMPDIR:-/tmp}/dsv4-bench-flash-${DSV4_BENCH_LAYERS:-4}${DSV4_BENCH_RATIO:+-r$DSV4_BENCH_RATIO}.gguf}
echo "== tests"
FILTER=${GTEST_FILTER:-*}
SHOW='^\[( +OK|  FAILED|  SKIPPED) |Failure|rror|^\[cuda|Expected|Which is|actual|^== |^(run|ctx|per layer|prefill per|full|model file)'
timeout ${TEST_TIMEOUT:-480} "$BUILD/dsv4_cuda_tests" --gtest_filter="$FILTER:-CudaBench.*" 2>&1 | tee "$LOG/tests.log" | grep -E "$SHOW"
RC=${PIPESTATUS[0]}
if [[ $QUICK == 0 && "$FILTER" == "*" ]]; then
  echo "== benchmarks"
  timeout ${BENCH_TIMEOUT:-300} "$BUILD/dsv4_cuda_tests" --gtest_filter="CudaBench.*" 2>&1 | tee -a "$LOG/tests.log" | grep -E "$SHOW"
  [[ ${PIPESTATUS[0]} == 0 ]] || RC=1
fi

# The server end to end over HTTP (not with --quick; GPU_SERVE=0 skips it): bench/gpu/serve.sh.
if [[ $QUICK == 0 && "$FILTER" == "*" && "${GPU_SERVE:-1}" == 1 ]]; then
  OUT=$LOG bench/gpu/serve.sh 2>&1 | tee "$LOG/serve.txt"
  [[ ${PIPESTATUS[0]} == 0 ]] || RC=1
fi

# GPU_AB="A=0 B=1;A=1 B=1" (not with --quick): the Flash benchmark again under each setting
# (';'-separated environment assignments), for A/B measurements in the same call.
if [[ $QUICK == 0 && -n "${GPU_AB:-}" ]]; then
  IFS=';' read -ra SETTINGS <<< "$GPU_AB"
  for setting in "${SETTINGS[@]}"; do
    echo "== A/B: $setting" | tee -a "$LOG/ab.log"
    env $setting "$BUILD/dsv4_cuda_tests" --gtest_filter="CudaBench.Flash*" 2>&1 |
      grep -E "^(ctx 1M lazy|per layer|prefill per)" | tee -a "$LOG/ab.log"
  done
fi

echo
echo "================================ summary ================================"
printf "%-60s %s\n" "tests passed / failed / skipped" \
  "$(grep -c '^\[       OK' "$LOG/tests.log") / $(grep -c '^\[  FAILED  \] [A-Za-z]' "$LOG/tests.log" | awk '{print int($1/2)}') / $(grep -c '^\[  SKIPPED \] [A-Za-z]' "$LOG/tests.log" | awk '{print int($1/2)}')"
grep -E '^\[cuda-(vs-cpu|greedy|kv)\]' "$LOG/tests.log" | sed 's/^/  /'
sed -n '/== CUDA benchmark/,/full 43-layer/p' "$LOG/tests.log"
[[ -f "$LOG/serve.txt" ]] && grep -E '^(check|disk check|MISMATCH|ERROR|\|)' "$LOG/serve.txt"
[[ -f "$LOG/ab.log" ]] && cat "$LOG/ab.log"
echo "total $(( $(date +%s) - T0 )) s; logs in $LOG; exit $RC"
exit $RC
