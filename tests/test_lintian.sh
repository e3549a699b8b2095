#!/usr/bin/env bash
# test_lintian.sh -- the three Debian packages CPack builds from this tree
# (fp4idxd, libfp4idx-client0, libfp4idx-client-dev) pass lintian with no
# error and no warning. deploy/install-deps.sh installs lintian; this test
# skips (77) only where it is not installed.
#
#   test_lintian.sh BUILD_DIR
set -u
build=$1
for t in cpack lintian; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed (deploy/install-deps.sh installs it)"; exit 77; }
done
tmp=$(mktemp -d /tmp/fp4idx-lintian-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$tmp" >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; echo "FAIL: cpack"; exit 1; }
debs=()
for p in fp4idxd libfp4idx-client0 libfp4idx-client-dev; do
  d=$(ls "$tmp"/${p}_*.deb 2>/dev/null | head -1)
  [ -f "$d" ] || { ls "$tmp"; echo "FAIL: no $p package"; exit 1; }
  debs+=("$d")
done
lintian --version
# Root gets a "not recommended" notice on stderr; the tags go to stdout.
lintian --fail-on error,warning --tag-display-limit 0 "${debs[@]}" >"$tmp/tags" 2>"$tmp/stderr"
rc=$?
cat "$tmp/tags"
if [ $rc -ne 0 ] || grep -q '^[EW]: ' "$tmp/tags"; then
  cat "$tmp/stderr"
  echo "FAIL: lintian reports errors or warnings (exit $rc)"
  exit 1
fi
echo "ok: lintian clean on ${debs[*]##*/}"
