#!/usr/bin/env bash
# The main job on the built-in default model: install, build, generate a reply.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
exec "$ROOT/build/dsv4" run -p "${1:-Explain in one paragraph what a KV cache is.}" -n 64
