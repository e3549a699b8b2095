#!/usr/bin/env bash
# test_units.sh -- the systemd units, sysusers.d and tmpfiles.d files of
# deploy/ are valid: `systemd-analyze verify` passes with no warning at all
# (it exits 0 on unknown keys, so any output fails the test), the instance
# units verify as fp4idxd@0, the sockets the services name match their
# .socket units, and sysusers/tmpfiles create the user and folders in a
# scratch root.
#
#   test_units.sh DEPLOY_DIR DAEMON_BINARY [CLI_BINARY]
# ExecStart names the installed /usr/bin/fp4idxd; verify needs an executable
# there, so the units are copied and pointed at DAEMON_BINARY.
set -u
deploy=$1
daemon=$2
cli=${3:-}
fail=0
pass=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
  if ! command -v $tool >/dev/null; then
    echo "SKIP: $tool not installed (Debian package systemd): cannot verify units"
    exit 77
  fi
done
[ -x "$daemon" ] || { echo "daemon binary $daemon missing"; echo "0 passed, 1 failed"; exit 1; }

tmp=$(mktemp -d /tmp/fp4idx-units-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$deploy"/fp4idxd.service "$deploy"/fp4idxd.socket "$tmp"/
cp "$deploy"/fp4idx-metrics.service "$deploy"/fp4idx-metrics.timer "$tmp"/
cp "$deploy"/fp4idxd@.service "$tmp"/fp4idxd@0.service
cp "$deploy"/fp4idxd@.socket "$tmp"/fp4idxd@0.socket
sed -i "s#/usr/bin/fp4idxd#$daemon#; s#/usr/bin/fp4idx-cli#${cli:-/bin/true}#" "$tmp"/*.service

cd "$tmp"
for unit in fp4idxd.service fp4idxd.socket fp4idxd@0.service fp4idxd@0.socket \
            fp4idx-metrics.service fp4idx-metrics.timer; do
  out=$(systemd-analyze verify --man=no "./$unit" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ -z "$out" ]; then ok "verify $unit"
  else bad "verify $unit (rc $rc): $out"; fi
done

# A unit with a typo must be caught by the same check (the check can fail).
sed 's/^Type=notify/Tpye=notify/' fp4idxd.service > typo.service
out=$(systemd-analyze verify --man=no ./typo.service 2>&1)
if [ -n "$out" ]; then ok "verify catches a typo"; else bad "verify missed a typo"; fi

# Service and socket agree on the socket path; Type=notify and a watchdog.
svc_sock=$(grep '^ExecStart=' "$deploy"/fp4idxd.service | grep -o -- '--socket [^ ]*' | cut -d' ' -f2)
lst_sock=$(sed -n 's/^ListenStream=//p' "$deploy"/fp4idxd.socket)
[ "$svc_sock" = "$lst_sock" ] && ok "socket path $lst_sock" || bad "socket path: service $svc_sock, socket $lst_sock"
svc_sock=$(grep '^ExecStart=' "$deploy"/fp4idxd@.service | grep -o -- '--socket [^ ]*' | cut -d' ' -f2)
lst_sock=$(sed -n 's/^ListenStream=//p' "$deploy"/fp4idxd@.socket)
[ "$svc_sock" = "$lst_sock" ] && [ "$svc_sock" = "/run/fp4idx/fp4idxd-%i.sock" ] \
  && ok "instance socket path" || bad "instance socket: $svc_sock vs $lst_sock"
for u in fp4idxd.service fp4idxd@.service; do
  grep -q '^Type=notify$' "$deploy/$u" && grep -q '^WatchdogSec=' "$deploy/$u" \
    && grep -q '^User=fp4idx$' "$deploy/$u" && ok "$u notify/watchdog/user" \
    || bad "$u lacks Type=notify, WatchdogSec or User"
done
grep -q '^SocketMode=0660$' "$deploy"/fp4idxd.socket && grep -q '^SocketGroup=fp4idx$' "$deploy"/fp4idxd.socket \
  && ok "socket mode 0660 group fp4idx" || bad "socket mode/group"

# sysusers.d and tmpfiles.d in a scratch root.
mkdir -p root/etc
if systemd-sysusers --root="$tmp/root" "$deploy"/sysusers.d/fp4idx.conf >/dev/null 2>&1 \
   && grep -q '^fp4idx:' root/etc/passwd && grep -q '^fp4idx:' root/etc/group; then
  ok "sysusers creates fp4idx"
else bad "sysusers"; fi
if systemd-tmpfiles --root="$tmp/root" --create "$deploy"/tmpfiles.d/fp4idx.conf >/dev/null 2>&1 \
   && [ -d root/run/fp4idx ] && [ -d root/var/lib/fp4idx ] \
   && [ "$(stat -c %a root/run/fp4idx)" = 750 ]; then
  ok "tmpfiles creates /run/fp4idx and /var/lib/fp4idx"
else bad "tmpfiles"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
