#!/usr/bin/env bash
# The CUDA test binary built on this machine for the device's calls. A fresh device machine's
# configure and build of dsv4_cuda_tests take ~70 s of the call's device time (runs 211, 212:
# 61-69 s of ninja), a fifth of a typical call; this machine has nvcc too (no GPU), and its
# binary runs there (x86-64, CUDA 13 on both, glibc 2.34 and GLIBCXX 3.4.30 at most).
#
#   bench/gpu/prebuilt.sh make          here (first, on a fresh checkout: scripts/setup.sh and
#                                       bench/gpu/make-deps.sh where their results are missing):
#                                       scripts/gpu.sh --build configures and builds
#                                       build-gpu's dsv4_cuda_tests, then keeps it (`keep BUILD
#                                       LAYERS`) in .prebuilt/ with the stamp of the sources it was
#                                       built from (~35 MB)
#   run(command="... scripts/gpu.sh --quick ...", carry=[".deps", ".prebuilt"])
#   bench/gpu/prebuilt.sh use BUILD LAYERS
#                                       there (scripts/gpu.sh, tests-only and --ncu runs): puts the
#                                       kept binary into BUILD when its stamp is the stamp of the
#                                       sources there and it starts; else exits 1, and scripts/gpu.sh
#                                       builds as before
#
# The stamp: the library layers and every file the binary is built from (CMakeLists.txt,
# include/, src/, tests/cuda/, the tests' shared headers) or whose build settings it takes
# (scripts/gpu.sh), by content. Any difference, a file more or less included, and the device
# builds.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
KEEP=$ROOT/.prebuilt

stamp() {   # $1: the library layers built
  {
    echo "${1}"
    find CMakeLists.txt scripts/gpu.sh include src tests/cuda tests/*.h -type f -not -path '*/node_modules/*' | LC_ALL=C sort |
      xargs sha256sum
  } | sha256sum | cut -c1-32
}

case "${1:-}" in
  make)
    command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
    # a fresh checkout: the Debian packages the build needs here, and .deps for the device's calls
    pkg-config --exists libpcre2-8 2> /dev/null || bash scripts/setup.sh || exit 1
    [[ -d .deps/usr ]] || bench/gpu/make-deps.sh > /dev/null || exit 1
    exec scripts/gpu.sh --build
    ;;
  keep)
    BUILD=${2:?"keep BUILD LAYERS"}
    LAYERS=${3:?"keep BUILD LAYERS"}
    mkdir -p "$KEEP"
    cp "$BUILD/dsv4_cuda_tests" "$KEEP/dsv4_cuda_tests"
    stamp "$LAYERS" > "$KEEP/stamp"
    grep -qxF '/.prebuilt/' .git/info/exclude 2>/dev/null || echo '/.prebuilt/' >> .git/info/exclude
    echo "kept: $KEEP/dsv4_cuda_tests ($(du -h "$KEEP/dsv4_cuda_tests" | cut -f1)), stamp $(cat "$KEEP/stamp")"
    ;;
  use)
    BUILD=${2:?"use BUILD LAYERS"}
    LAYERS=${3:?"use BUILD LAYERS"}
    [[ -x $KEEP/dsv4_cuda_tests && -f $KEEP/stamp ]] || exit 1
    want=$(stamp "$LAYERS")
    if [[ "$(cat "$KEEP/stamp")" != "$want" ]]; then
      echo "prebuilt: its stamp $(cat "$KEEP/stamp") is not these sources' $want: building"
      exit 1
    fi
    "$KEEP/dsv4_cuda_tests" --gtest_list_tests > /dev/null 2>&1 || { echo "prebuilt: it does not start here: building"; exit 1; }
    mkdir -p "$BUILD"
    cp "$KEEP/dsv4_cuda_tests" "$BUILD/dsv4_cuda_tests"
    ;;
  *)
    echo "usage: bench/gpu/prebuilt.sh make | keep BUILD LAYERS | use BUILD LAYERS" >&2
    exit 2
    ;;
esac
