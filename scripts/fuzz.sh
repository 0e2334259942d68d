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
"$build/gguf_fuzz" "$corpus" "$seeds" \
    -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1
