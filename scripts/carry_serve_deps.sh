#!/usr/bin/env bash
# Gathers what `specdec-kimi serve` needs at build and run time and the H200 machine lacks
# (cpp-httplib, PCRE2, and the OpenSSL / zlib / brotli that Debian's cpp-httplib was built
# against) from this machine's Debian packages into .carry/serve-deps (git-ignored), for the
# device tool's `carry`:
#   include/   httplib.h, pcre2.h, openssl/, zlib.h, zconf.h, brotli/
#   lib/       the shared libraries (with their soname links)
#   lib/pkgconfig/cpp-httplib.pc   Debian's flags, pointing here, without its .pc dependencies
# scripts/device_serve.sh builds and runs against it (PKG_CONFIG_PATH, PCRE2_ROOT,
# LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
out=.carry/serve-deps
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/pkgconfig"
arch=/usr/lib/x86_64-linux-gnu
cp /usr/include/httplib.h /usr/include/pcre2.h /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
cp -r /usr/include/openssl /usr/include/brotli "$out/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$out/include/openssl/"
for lib in libcpp-httplib.so.0.11 libpcre2-8.so.0 libssl.so.3 libcrypto.so.3 libz.so.1 \
           libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "$arch/$lib" "$out/lib/$lib"
done
# Plain copies under the link names too (the carry takes files, not links).
cp "$out/lib/libcpp-httplib.so.0.11" "$out/lib/libcpp-httplib.so"
cp "$out/lib/libpcre2-8.so.0" "$out/lib/libpcre2-8.so"
cat > "$out/lib/pkgconfig/cpp-httplib.pc" <<PC
prefix=\${pcfiledir}/../..
Name: cpp-httplib
Description: cpp-httplib (Debian's build, carried)
Version: 0.11.4
Libs: -L\${prefix}/lib -lcpp-httplib -pthread
Cflags: -I\${prefix}/include -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT
PC
du -sh "$out"
