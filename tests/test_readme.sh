#!/usr/bin/env bash
# test_readme.sh -- README.md's library example, as written: the C program
# of "## The library" is saved as app.c and the shell block after it runs
# line by line in a scratch folder whose build/ is this build tree (the
# block's cmake line is skipped: this build tree is its result). The
# program must connect to the daemon the block starts and print its result.
#
#   test_readme.sh README.md BUILD_DIR
set -u
readme=$1
build=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fp4idx-readme-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The section, then its first ```c and first ```sh blocks.
section=$(awk '/^## The library/{on=1; next} /^## /{on=0} on' "$readme")
[ -n "$section" ] || fail "README has no '## The library' section"
printf '%s\n' "$section" | awk '/^```c$/{on=1; next} /^```/{if(on) exit} on' >"$tmp/app.c"
printf '%s\n' "$section" | awk '/^```sh$/{on=1; next} /^```/{if(on) exit} on' >"$tmp/block.sh"
grep -q 'fp4idx_client_connect' "$tmp/app.c" || fail "no C example in the section"
grep -q 'pkg-config' "$tmp/block.sh" || fail "no pkg-config line in the shell block"

ln -s "$build" "$tmp/build"
# Every line but the build itself, verbatim; the block's own `kill %1` stops
# its daemon.
grep -v '^cmake ' "$tmp/block.sh" >"$tmp/run.sh"
echo "== running (in $tmp):"; cat "$tmp/run.sh"
out=$(cd "$tmp" && unset PKG_CONFIG_PATH FP4IDX_SOCKET &&
      timeout 120 bash -e run.sh 2>"$tmp/stderr") || {
  cat "$tmp/stderr"; fail "the README block failed: $out"; }
echo "== output: $out"
# One bf16 1.0 key against q = e0 with weight 1: position 0, logit 1.
echo "$out" | grep -qx 'best position 0, logit 1' || { cat "$tmp/stderr"; fail "unexpected output"; }
# The program was linked against the build tree's shared library.
ldd "$tmp/app" | grep -q "$build/client/libfp4idx-client.so" ||
  fail "app not linked to $build/client/libfp4idx-client.so: $(ldd "$tmp/app")"
echo "ok: README example compiles against the build tree and runs"
