# Sourced by the GPU scripts (scripts/gpu.sh, bench/gpu_bench.sh, bench/gpu/serve.sh) with
# ROOT set to the repository: puts the development packages the device image lacks, carried in
# .deps/usr (bench/gpu/make-deps.sh), on the tools' search paths when the folder is there.
# `--headers` also on the compilers' include path (CPATH), for builds of the dsv4 binary: its
# server includes cpp-httplib, whose header includes openssl's, whose configuration header
# sits in the multiarch folder, which is searched only under /usr.
if [[ -d $ROOT/.deps/usr ]]; then
  export PATH=$ROOT/.deps/usr/bin:$PATH
  export LD_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$ROOT/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  if [[ "${1:-}" == --headers ]]; then
    export CPATH=$ROOT/.deps/usr/include:$ROOT/.deps/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  fi
fi
