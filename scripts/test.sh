#!/usr/bin/env bash
# The whole test suite: install, build with warnings as errors, run every test (the npm
# oracles included), the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer,
# and the GGUF parser fuzzer for a bounded time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
source "$ROOT/scripts/env.sh"
export DSV4_REQUIRE_ORACLES=1   # a missing oracle is a failure here, not a skip
FUZZ_SECONDS="${DSV4_FUZZ_SECONDS:-60}"

step() { printf '\n==== %s\n' "$*" >&2; }

step "build (Release, -Werror)"
"$ROOT/scripts/build.sh" "$ROOT/build" -DDSV4_WERROR=ON

step "tests"
ctest --test-dir "$ROOT/build" -j "$DSV4_JOBS" --output-on-failure --timeout 1200

step "unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
"$ROOT/scripts/build.sh" "$ROOT/build-asan" -DCMAKE_BUILD_TYPE=Debug -DDSV4_SANITIZE=ON -DDSV4_NATIVE=OFF \
  -DDSV4_WERROR=ON -DCMAKE_CXX_FLAGS=-O1
# The unit tests; the end-to-end comparisons (oracles, quantised models, the CLI and the
# server) ran above and would only be slow here.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$ROOT/build-asan/dsv4_tests" --gtest_filter='-LlamaOracle*:*Bench*:*Oracle*:Quantized*:Cli*:Serve*:TokenizerLlama*'

step "fuzz the GGUF parser for ${FUZZ_SECONDS}s"
"$ROOT/scripts/fuzz.sh" "$FUZZ_SECONDS"
