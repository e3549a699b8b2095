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
cp "$deploy"/fp4idx-mps@.service "$tmp"/fp4idx-mps@0.service
sed -i "s#/usr/bin/fp4idxd#$daemon#; s#/usr/bin/fp4idx-cli#${cli:-/bin/true}#" "$tmp"/*.service

cd "$tmp"
for unit in fp4idxd.service fp4idxd.socket fp4idxd@0.service fp4idxd@0.socket \
            fp4idx-mps@0.service fp4idx-metrics.service fp4idx-metrics.timer; do
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

# MPS per GPU: fp4idxd@N wants fp4idx-mps@N and starts after it, both use
# the same pipe folder, the daemon may write there under ProtectSystem, and
# the device comes from the MPS unit's file when MPS runs (%i otherwise).
m="$deploy"/fp4idx-mps@.service
i="$deploy"/fp4idxd@.service
grep -q '^Wants=fp4idx-mps@%i.service$' "$i" && grep -q '^After=.*fp4idx-mps@%i.service' "$i" \
  && grep -q '^Before=fp4idxd@%i.service$' "$m" \
  && ok "fp4idxd@N wants fp4idx-mps@N, ordered after it" || bad "fp4idxd@/fp4idx-mps@ ordering"
mp=$(sed -n 's/^Environment=CUDA_MPS_PIPE_DIRECTORY=//p' "$m")
ip=$(sed -n 's/^Environment=CUDA_MPS_PIPE_DIRECTORY=//p' "$i")
[ "$mp" = /run/fp4idx-mps/%i ] && [ "$ip" = "$mp" ] && grep -q "^ReadWritePaths=-$mp\$" "$i" \
  && grep -q "^RuntimeDirectory=fp4idx-mps/%i\$" "$m" \
  && ok "MPS pipe folder $mp in both units" || bad "MPS pipe folder: mps '$mp', daemon '$ip'"
grep -q '^Environment=CUDA_MPS_LOG_DIRECTORY=/var/log/fp4idx-mps/%i$' "$m" \
  && grep -q '^LogsDirectory=fp4idx-mps/%i$' "$m" && ok "MPS log folder" || bad "MPS log folder"
grep -q "^EnvironmentFile=-$mp/fp4idx.env\$" "$i" && grep -q -- '--device ${FP4IDXD_DEVICE}' "$i" \
  && grep -q '^Environment=FP4IDXD_DEVICE=%i$' "$i" && grep -q 'FP4IDXD_DEVICE=0' "$m" \
  && grep -q "> $mp/fp4idx.env" "$m" \
  && ok "device: 0 under MPS (fp4idx.env), %i without" || bad "device selection under MPS"
grep -q "nvidia-cuda-mps-control -d" "$m" && grep -q "echo quit | nvidia-cuda-mps-control" "$m" \
  && ok "MPS unit starts and quits the control daemon" || bad "MPS start/stop"
# The MPS unit's start and stop, run for real with stand-ins for nvidia-smi
# and nvidia-cuda-mps-control in a scratch folder (the commands as the unit
# has them, paths moved into the scratch root).
mkdir -p fake/bin fake/run
cat > fake/bin/nvidia-smi <<'SH'
#!/bin/sh
echo GPU-11111111-2222-3333-4444-555555555555
SH
cat > fake/bin/nvidia-cuda-mps-control <<'SH'
#!/bin/sh
if [ "$1" = -d ]; then echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY" > "$FAKE/started"
else cat > "$FAKE/quit"; fi
SH
chmod +x fake/bin/*
unit_cmd() { # the unit's line $1 (continuations joined), %i=0, %%=%, $$=$
  awk -v k="$1=" 'index($0, k) == 1 { on = 1; $0 = substr($0, length(k) + 1) }
    on { c = sub(/\\$/, ""); printf "%s", $0; if (!c) exit }' "$m" \
    | sed -e 's#%i#0#g' -e 's#%%#%#g' -e 's#[$][$]#$#g' -e "s#/run/fp4idx-mps#$tmp/fake/run#g"
}
mkdir -p fake/run/0
pre=$(unit_cmd ExecStartPre); start=$(unit_cmd ExecStart); stop=$(unit_cmd ExecStop)
export FAKE="$tmp/fake"
if PATH="$tmp/fake/bin:$PATH" CUDA_MPS_PIPE_DIRECTORY=$tmp/fake/run/0 eval "$pre" \
   && PATH="$tmp/fake/bin:$PATH" CUDA_MPS_PIPE_DIRECTORY=$tmp/fake/run/0 eval "$start" \
   && PATH="$tmp/fake/bin:$PATH" eval "$stop" \
   && grep -qx 'CUDA_VISIBLE_DEVICES=GPU-11111111-2222-3333-4444-555555555555' fake/run/0/fp4idx.env \
   && grep -qx 'FP4IDXD_DEVICE=0' fake/run/0/fp4idx.env \
   && grep -qx "GPU-11111111-2222-3333-4444-555555555555 $tmp/fake/run/0" fake/started \
   && grep -qx quit fake/quit; then
  ok "MPS unit commands: env file, control daemon on the GPU's UUID, quit"
else bad "MPS unit commands (pre: $pre; start: $start; stop: $stop)"; fi

# sysusers.d and tmpfiles.d in a scratch root.
mkdir -p root/etc
if systemd-sysusers --root="$tmp/root" "$deploy"/sysusers.d/fp4idx.conf >/dev/null 2>&1 \
   && grep -q '^fp4idx:' root/etc/passwd && grep -q '^fp4idx:' root/etc/group; then
  ok "sysusers creates fp4idx"
else bad "sysusers"; fi
if systemd-tmpfiles --root="$tmp/root" --create "$deploy"/tmpfiles.d/fp4idx.conf >/dev/null 2>&1 \
   && [ -d root/run/fp4idx ] && [ -d root/var/lib/fp4idx ] \
   && [ "$(stat -c %a root/run/fp4idx)" = 750 ] && [ -d root/run/fp4idx-mps ] \
   && [ -d root/var/log/fp4idx-mps ] && [ "$(stat -c %a root/run/fp4idx-mps)" = 755 ]; then
  ok "tmpfiles creates /run/fp4idx, /var/lib/fp4idx and the MPS folders"
else bad "tmpfiles"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
