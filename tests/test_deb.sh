#!/usr/bin/env bash
# test_deb.sh -- the .deb: CPack builds it from this build tree, it holds
# what the issue lists (binaries, library, headers, pkg-config file, units,
# sysusers/tmpfiles, options file, man pages) with its maintainer scripts and
# Debian 12 runtime dependencies, and the daemon it carries, started the way
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

# 1. Build the package (an install of this build tree into CPack's staging).
if cpack --config "$build/CPackConfig.cmake" -G DEB -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1; then
  ok "cpack -G DEB"
else
  cat "$tmp/cpack.log"; bad "cpack"; finish
fi
deb=$(ls "$tmp"/pkg/fp4idx_*.deb 2>/dev/null | head -1)
[ -f "$deb" ] && ok "package $(basename "$deb")" || { bad "no .deb"; finish; }

# 2. Contents and control data.
list=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/fp4idxd ./usr/bin/fp4idx-cli ./usr/lib/libfp4idx-client.so \
         ./usr/include/fp4idx/fp4idx_client.h ./usr/lib/pkgconfig/libfp4idx-client.pc \
         ./usr/lib/systemd/system/fp4idxd.service ./usr/lib/systemd/system/fp4idxd.socket \
         ./usr/lib/systemd/system/fp4idxd@.service ./usr/lib/systemd/system/fp4idxd@.socket \
         ./usr/lib/systemd/system/fp4idx-metrics.service ./usr/lib/systemd/system/fp4idx-metrics.timer \
         ./usr/lib/sysusers.d/fp4idx.conf ./usr/lib/tmpfiles.d/fp4idx.conf \
         ./etc/default/fp4idxd ./usr/share/man/man8/fp4idxd.8 ./usr/share/man/man1/fp4idx-cli.1; do
  echo "$list" | grep -qx -- "$f" && ok "has $f" || bad "missing $f"
done
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
  if dpkg -i "$deb" >"$tmp/dpkg.log" 2>&1; then ok "dpkg -i"; else cat "$tmp/dpkg.log"; bad "dpkg -i"; fi
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
  dpkg --purge fp4idx >/dev/null 2>&1 && ok "dpkg --purge" || bad "purge"
  [ ! -e /usr/bin/fp4idxd ] && [ ! -e /var/lib/fp4idx ] && ok "purged" || bad "files left after purge"
fi
finish
