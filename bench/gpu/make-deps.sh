#!/usr/bin/env bash
# Makes .deps/usr: the Debian 12 development packages the GPU machine's image lacks (pcre2-8,
# xxhash, gtest/gmock, nlohmann-json, pkgconf; cpp-httplib with the headers and libraries it
# needs, for `dsv4 serve`), unpacked without installing (apt-get download
# + dpkg -x) and made relocatable (the .pc files find their prefix from their own place), so
# the folder can travel to the device machine: run(..., carry=[".deps"]); scripts/gpu.sh puts
# it on the search paths. ~5 MB. Run once on this (Debian 12) machine from anywhere; .deps is
# in .git/info/exclude.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D=$ROOT/.deps
grep -qx '/.deps/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.deps/' >> "$ROOT/.git/info/exclude"
rm -rf "$D" && mkdir -p "$D/pkgs"
(cd "$D/pkgs" && apt-get download libpcre2-dev libpcre2-8-0 libpcre2-posix3 libxxhash-dev libxxhash0 libgtest-dev \
  libgmock-dev nlohmann-json3-dev pkgconf pkgconf-bin libpkgconf3 \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev libbrotli1 zlib1g-dev 2>&1 | grep -v '^W: Download is performed unsandboxed')
for f in "$D"/pkgs/*.deb; do dpkg -x "$f" "$D"; done
rm -rf "$D/pkgs" "$D/usr/share/doc" "$D/usr/share/man"
rm -f "$D"/usr/lib/x86_64-linux-gnu/lib{ssl,crypto,z,brotli*}.a   # shared linking only: 8 MB less to carry
PC=$D/usr/lib/x86_64-linux-gnu/pkgconfig
rm -f "$PC"/libpcre2-16.pc "$PC"/libpcre2-32.pc
sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|; s|^libdir=/usr/lib/x86_64-linux-gnu$|libdir=${pcfiledir}/..|; s|^includedir=/usr/include$|includedir=${pcfiledir}/../../../include|' "$PC"/*.pc
PKG_CONFIG_PATH=$PC LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu "$D/usr/bin/pkgconf" --cflags --libs gtest gmock libpcre2-8 libxxhash cpp-httplib
du -sh "$D"
