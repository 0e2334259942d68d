#!/usr/bin/env bash
# Builds the GGUF reader fuzzer (clang + libFuzzer + ASan/UBSan) into build-fuzz, seeds it
# with a few small valid files, and runs it for a bounded time. Fails on any crash,
# sanitizer report, leak or timeout; the offending input is left in build-fuzz/gguf-artifacts.
#
# Usage: scripts/fuzz.sh [seconds]      (default 60; DSV4_JOBS sets the build parallelism)
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
jobs="${DSV4_JOBS:-2}"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
    -DDSV4_FUZZ=ON -DDSV4_LAYERS="common;quant;gguf" -DDSV4_CUDA=OFF -DDSV4_NATIVE=OFF >/dev/null
ninja -C "$build" -j "$jobs" gguf_fuzz

seeds="$build/gguf-seeds"        # regenerated each run from the current writer
corpus="$build/gguf-corpus"      # grows across runs
artifacts="$build/gguf-artifacts"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
DSV4_GGUF_WRITE_SEEDS="$seeds" "$build/gguf_fuzz"
echo "fuzz.sh: $(ls "$seeds" | wc -l) seed files, running for ${seconds}s"

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
rm -f "$artifacts"/timeout-*
status=0
"$build/gguf_fuzz" "$corpus" "$seeds" \
    -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?

# A unit of at most 8 KB parses in microseconds, so a 10 s timeout is either a real hang or
# the machine stalling the process (a shared CI runner once did, mid-run, on an input the
# parser reads in 0 s). Tell them apart by running the input alone again: a hang repeats.
shopt -s nullglob
timeouts=("$artifacts"/timeout-*)
if (( status != 0 && ${#timeouts[@]} == 1 )); then
    unit="${timeouts[0]}"
    echo "fuzz.sh: timeout on $unit; running it alone 3 times to see whether it repeats"
    for k in 1 2 3; do
        "$build/gguf_fuzz" -timeout=10 -rss_limit_mb=2048 "$unit" || exit $?
    done
    echo "fuzz.sh: $unit runs in well under the 10 s limit on its own: the timeout was the" \
         "machine stalling, not the parser; not a failure"
    status=0
fi
exit "$status"
