#!/usr/bin/env bash
# test_deb.sh -- the .debs: CPack builds fp4idxd (binaries, units,
# sysusers/tmpfiles, options file, man pages), libfp4idx-client0 (the shared
# library, shlibs, ldconfig trigger) and libfp4idx-client-dev (headers, .so
# link, static library, .pc, PROTOCOL.md) from this build tree, each file in
# its package under the multiarch library folder, with maintainer scripts and
# Debian 12 runtime dependencies; and the daemon fp4idxd carries, started the way
# fp4idxd.socket + fp4idxd.service say (socket activation on the unit's
# ListenStream, the unit's ExecStart with its EnvironmentFile's options),
# answers `fp4idx-cli info`, then saves its snapshot on SIGTERM.
#
#   test_deb.sh BUILD_DIR            extract into a scratch root (no system change)
#   FP4IDX_TEST_DPKG_INSTALL=1 test_deb.sh BUILD_DIR
#                                    also `dpkg -i` for real (root), run the
#                                    installed daemon as user fp4idx the way
#                                    the units do, then `dpkg --purge`.
set -u
build=$1
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
finish() { echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; exit $?; }

for t in cpack dpkg-deb systemd-socket-activate; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
done
tmp=$(mktemp -d /tmp/fp4idx-deb-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. Build the packages (an install of this build tree into CPack's staging).
if cpack --config "$build/CPackConfig.cmake" -G DEB -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1; then
  ok "cpack -G DEB"
else
  cat "$tmp/cpack.log"; bad "cpack"; finish
fi
deb=$(ls "$tmp"/pkg/fp4idxd_*.deb 2>/dev/null | head -1)
lib=$(ls "$tmp"/pkg/libfp4idx-client0_*.deb 2>/dev/null | head -1)
dev=$(ls "$tmp"/pkg/libfp4idx-client-dev_*.deb 2>/dev/null | head -1)
for f in "$deb" "$lib" "$dev"; do
  [ -f "$f" ] && ok "package $(basename "$f")" || { ls "$tmp/pkg"; bad "a package is missing"; finish; }
done
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)

# 2. Contents and control data: each file in the package it belongs to.
has() { # has PACKAGE.deb FILE...
  local d=$1 list; shift
  list=$(dpkg-deb -c "$d" | awk '{print $6}')
  for f in "$@"; do
    echo "$list" | grep -qx -- "$f" && ok "$(basename "$d" | cut -d_ -f1) has $f" || bad "$(basename "$d") lacks $f"
  done
}
has "$deb" ./usr/bin/fp4idxd ./usr/bin/fp4idx-cli \
  ./usr/lib/systemd/system/fp4idxd.service ./usr/lib/systemd/system/fp4idxd.socket \
  ./usr/lib/systemd/system/fp4idxd@.service ./usr/lib/systemd/system/fp4idxd@.socket \
  ./usr/lib/systemd/system/fp4idx-mps@.service \
  ./usr/lib/systemd/system/fp4idx-metrics.service ./usr/lib/systemd/system/fp4idx-metrics.timer \
  ./usr/lib/sysusers.d/fp4idx.conf ./usr/lib/tmpfiles.d/fp4idx.conf \
  ./etc/default/fp4idxd ./usr/share/man/man8/fp4idxd.8.gz ./usr/share/man/man1/fp4idx-cli.1.gz \
  ./usr/share/doc/fp4idxd/copyright ./usr/share/doc/fp4idxd/changelog.gz
has "$lib" ./usr/lib/$ma/libfp4idx-client.so.0 ./usr/share/doc/libfp4idx-client0/copyright
has "$dev" ./usr/lib/$ma/libfp4idx-client.so ./usr/lib/$ma/libfp4idx-client.a \
  ./usr/lib/$ma/pkgconfig/libfp4idx-client.pc ./usr/include/fp4idx/fp4idx_client.h \
  ./usr/include/fp4idx/fp4idx_status.h ./usr/share/doc/libfp4idx-client-dev/PROTOCOL.md \
  ./usr/share/doc/libfp4idx-client-dev/copyright
# Nothing twice, and no library in the daemon's package.
dup=$(for d in "$deb" "$lib" "$dev"; do dpkg-deb -c "$d" | awk '$1 !~ /^d/ {print $6}'; done | sort | uniq -d)
[ -z "$dup" ] && ok "no file in two packages" || bad "files in two packages: $dup"
# MPS set up by the package: the per-GPU unit, wanted by fp4idxd@N, and
# its folders in tmpfiles.d.
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/fp4idxd@.service \
  | grep -q '^Wants=fp4idx-mps@%i.service$' && dpkg-deb --fsys-tarfile "$deb" \
  | tar -xO ./usr/lib/tmpfiles.d/fp4idx.conf | grep -q '^d /run/fp4idx-mps ' \
  && ok "fp4idxd@N wants fp4idx-mps@N; tmpfiles makes the MPS folders" || bad "MPS set-up in the package"
dpkg-deb -c "$deb" | grep -q 'libfp4idx-client' && bad "fp4idxd carries the library" || ok "fp4idxd carries no library"
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/share/man/man8/fp4idxd.8.gz | gzip -dc | grep -q '^\.TH' \
  && ok "man page gzipped" || bad "fp4idxd.8.gz is not a gzipped man page"
for d in "$deb" "$lib" "$dev"; do
  m=$(dpkg-deb -f "$d" Maintainer)
  case "$m" in *localhost*|"") bad "maintainer '$m'";; *@*.*) ok "maintainer $m";; *) bad "maintainer '$m'";; esac
done
dpkg-deb -f "$dev" Depends | grep -q 'libfp4idx-client0 (= ' && ok "-dev depends on the exact library" || bad "-dev Depends: $(dpkg-deb -f "$dev" Depends)"
dpkg-deb -e "$lib" "$tmp/libcontrol"
grep -q "^libfp4idx-client 0 libfp4idx-client0" "$tmp/libcontrol/shlibs" && ok "shlibs" || bad "shlibs"
grep -qx "activate-noawait ldconfig" "$tmp/libcontrol/triggers" && ok "ldconfig trigger" || bad "triggers"
dpkg-deb -e "$deb" "$tmp/control"
for s in postinst prerm postrm; do
  [ -x "$tmp/control/$s" ] && sh -n "$tmp/control/$s" && ok "$s present, executable, parses" || bad "$s"
done
grep -qx /etc/default/fp4idxd "$tmp/control/conffiles" && ok "conffiles" || bad "conffiles"
deps=$(sed -n 's/^Depends: //p' "$tmp/control/control")
for p in libuv1 libmsgpackc2; do
  echo "$deps" | grep -q "$p" && ok "depends on $p" || bad "Depends lacks $p: $deps"
done
# Every dependency is a real package here (installed or installable).
for p in $(echo "$deps" | tr ',' '\n' | sed 's/(.*)//; s/ //g'); do
  dpkg-query -W "$p" >/dev/null 2>&1 || apt-cache show "$p" >/dev/null 2>&1 \
    && ok "dependency $p exists" || bad "dependency $p unknown"
done

# 3. The daemon, started the way the units say, from a scratch root.
root="$tmp/root"
dpkg-deb -x "$deb" "$root"
unit="$root/usr/lib/systemd/system/fp4idxd.service"
sockunit="$root/usr/lib/systemd/system/fp4idxd.socket"
listen=$(sed -n 's/^ListenStream=//p' "$sockunit")
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
[ "$listen" = /run/fp4idx/fp4idxd.sock ] && ok "ListenStream $listen" || bad "ListenStream $listen"
# Paths of the real system -> the scratch root.
run="$tmp/run"; state="$tmp/state"; mkdir -p "$run"
cmd=${exec_line//\/usr\/bin\//$root/usr/bin/}
cmd=${cmd//\/run\/fp4idx/$run}
cmd=${cmd//\/var\/lib\/fp4idx/$state}
sock=${listen//\/run\/fp4idx/$run}
# EnvironmentFile=-/etc/default/fp4idxd supplies FP4IDXD_OPTS; a small pool
# and the CPU backend keep the test light on any machine.
FP4IDXD_OPTS=
. "$root/etc/default/fp4idxd"
FP4IDXD_OPTS="$FP4IDXD_OPTS --backend cpu --cache-bytes 64M"
cmd=${cmd//\$FP4IDXD_OPTS/$FP4IDXD_OPTS}
echo "running: systemd-socket-activate -l $sock $cmd"
# shellcheck disable=SC2086
systemd-socket-activate -l "$sock" $cmd >"$tmp/daemon.log" 2>&1 &
pid=$!
cli="$root/usr/bin/fp4idx-cli"
out=
for _ in $(seq 100); do
  [ -S "$sock" ] && out=$("$cli" -s "$sock" info 2>&1) && break
  sleep 0.1
done
echo "$out" | grep -q '^server: fp4idxd' && ok "fp4idx-cli info answers" || { cat "$tmp/daemon.log"; bad "info: $out"; }
"$cli" -s "$sock" append 3 --random 500 --seed 1 >/dev/null 2>&1 && ok "append" || bad "append"
kill -TERM "$pid"
wait "$pid"
code=$?
pid=
[ $code -eq 0 ] && ok "SIGTERM: exit 0" || { cat "$tmp/daemon.log"; bad "exit $code"; }
[ -f "$state/snapshot.fp4s" ] && ok "snapshot saved in the state folder" || bad "no snapshot"
grep -q "inherited socket" "$tmp/daemon.log" && ok "used the inherited socket" || bad "not socket-activated"

# 4. Optional: a real dpkg -i on this machine.
if [ "${FP4IDX_TEST_DPKG_INSTALL:-0}" = 1 ]; then
  if dpkg -i "$deb" "$lib" "$dev" >"$tmp/dpkg.log" 2>&1; then ok "dpkg -i (3 packages)"; else cat "$tmp/dpkg.log"; bad "dpkg -i"; fi
  # The installed -dev package builds a client: headers and library found
  # through the installed .pc, the program runs against the installed .so.
  printf '#include <fp4idx/fp4idx_client.h>\n#include <stdio.h>\nint main(void){puts(fp4idx_client_version());return 0;}\n' >"$tmp/v.c"
  # shellcheck disable=SC2046
  cc "$tmp/v.c" -o "$tmp/v" $(pkg-config --cflags --libs libfp4idx-client) && "$tmp/v" >/dev/null \
    && ok "a client builds and runs against the installed packages" || bad "client against the installed packages"
  getent passwd fp4idx >/dev/null && ok "user fp4idx created" || bad "no user fp4idx"
  [ -d /var/lib/fp4idx ] && [ "$(stat -c %U /var/lib/fp4idx)" = fp4idx ] && ok "/var/lib/fp4idx owned by fp4idx" || bad "/var/lib/fp4idx"
  systemd-tmpfiles --create fp4idx.conf >/dev/null 2>&1
  . /etc/default/fp4idxd
  icmd=$(sed -n 's/^ExecStart=//p' /usr/lib/systemd/system/fp4idxd.service)
  icmd=${icmd//\$FP4IDXD_OPTS/$FP4IDXD_OPTS --backend cpu --cache-bytes 64M}
  # As the unit: user fp4idx, socket from the .socket unit (mode 0660 group fp4idx).
  # shellcheck disable=SC2086
  # setpriv execs in place (runuser would fork, and LISTEN_PID would not match).
  systemd-socket-activate -l /run/fp4idx/fp4idxd.sock setpriv --reuid=fp4idx --regid=fp4idx --init-groups -- $icmd >"$tmp/idaemon.log" 2>&1 &
  pid=$!
  out=
  for _ in $(seq 100); do
    [ -S /run/fp4idx/fp4idxd.sock ] && out=$(fp4idx-cli info 2>&1) && break
    sleep 0.1
  done
  echo "$out" | grep -q '^server: fp4idxd' && ok "installed daemon answers fp4idx-cli info" || { cat "$tmp/idaemon.log"; bad "installed: $out"; }
  kill -TERM "$pid"; wait "$pid"; pid=
  [ -f /var/lib/fp4idx/snapshot.fp4s ] && ok "installed daemon saved /var/lib/fp4idx/snapshot.fp4s" || { cat "$tmp/idaemon.log"; bad "no snapshot in /var/lib/fp4idx"; }
  rm -f /run/fp4idx/fp4idxd.sock
  dpkg --purge libfp4idx-client-dev libfp4idx-client0 fp4idxd >/dev/null 2>&1 && ok "dpkg --purge (3 packages)" || bad "purge"
  [ ! -e /usr/bin/fp4idxd ] && [ ! -e /var/lib/fp4idx ] && [ ! -e "/usr/lib/$ma/libfp4idx-client.so.0" ] &&
    [ ! -e /usr/include/fp4idx ] && ok "purged" || bad "files left after purge"
fi
finish
