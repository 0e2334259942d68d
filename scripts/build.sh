#!/usr/bin/env bash
# Configures and builds dsv4 (Release; CUDA when nvcc is found). Usage: build.sh [DIR] [cmake args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
DIR="${1:-$ROOT/build}"
shift || true
cmake -S "$ROOT" -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$DIR" -j "$DSV4_JOBS"
