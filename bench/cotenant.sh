#!/usr/bin/env bash
# cotenant.sh -- fp4idxd beside a serving engine on one GPU: the request
# latencies idle and busy, with and without MPS, and what bounds them under
# MPS (the co-tenant's SM share, its MPS client priority, our stream
# priority). The busy load is fp4idx-cotenant-gemm (bench/cotenant_gemm.cu:
# 4096^3 bf16 GEMMs back to back); with torch on the machine one more case
# runs torch's matmul (cuBLAS) instead, as a cross-check.
#
# Cases (fp4idx-bench-socket -s against one daemon; p50 of each request):
#   info, 64-key score full logits (R=4, H=32), 16,384 keys top-2048 and
#   400,000 keys top-2048 (R=4, H=32)
#   1 idle                       no MPS
#   2 busy, time slices          no MPS, the co-tenant beside us
#   3 idle under MPS             MPS control daemon started, fp4idxd restarted
#   4 busy MPS, default share    co-tenant with all SMs
#   5 busy MPS, co-tenant 80%    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80 for it
#   6 busy MPS, co-tenant 50%    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
#   7 busy MPS, co-tenant prio 1 CUDA_MPS_CLIENT_PRIORITY=1 (below normal)
#   8 busy MPS, 80% + prio 1
#   9 busy MPS, torch matmul     (only where python3 imports torch with CUDA)
# Each case records `fp4idx-cli info` while it runs (gpu_sharing: exclusive,
# time_slice, mps; gpu_other_processes); the daemon's logs are kept, and the
# time-slice warning and the metrics' gpu gauges are checked.
#
# How to run it (on the GPU machine, as root: it starts and stops MPS; about
# 2-3 minutes):
#     cmake -S . -B build-cuda -DFP4IDX_CUDA=ON -DFP4IDX_WERROR=ON
#     cmake --build build-cuda -j --target fp4idxd fp4idx-cli fp4idx-bench-socket \
#       fp4idx-cotenant-gemm
#     mkdir -p build-cuda/cotenant
#     cp build-cuda/daemon/fp4idxd build-cuda/client/fp4idx-cli \
#        build-cuda/bench/fp4idx-bench-socket build-cuda/bench/fp4idx-cotenant-gemm \
#        build-cuda/cotenant/
#     bash bench/cotenant.sh build-cuda/cotenant
# DIR/devlib, when present, holds shared libraries the binaries need on a
# machine that lacks them (it goes first on LD_LIBRARY_PATH).
# It writes every log under $OUT (default /tmp/cotenant-out; one tar:
# cotenant.tar.gz) and prints the table last. Everything it starts (daemon,
# co-tenant, MPS) is stopped on exit.
set -u
bin=$(cd "${1:-build-cuda/cotenant}" && pwd)
out=${OUT:-/tmp/cotenant-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=$(mktemp -d /tmp/fp4idx-cotenant-XXXXXX)
logs="$work/logs"
mkdir -p "$logs"
sock="$work/d.sock"
daemon_pid=
load_pid=
mps_on=0
N_FAST=${N_FAST:-1000}   # (a) calls per case: fast cases
N_SLOW=${N_SLOW:-150}    # the same beside a time-sliced co-tenant (~5 ms each)
B=${B:-20}               # (c) scores per case

stop_load() {
  if [ -n "$load_pid" ]; then
    kill -TERM "$load_pid" 2>/dev/null
    wait "$load_pid" 2>/dev/null
    load_pid=
  fi
}
stop_daemon() {
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=
  fi
}
stop_mps() {
  if [ $mps_on = 1 ]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
    sleep 1
    mps_on=0
  fi
}
finish() {
  stop_load
  stop_daemon
  stop_mps
  cp -r /tmp/mps-log "$logs/mps-log" 2>/dev/null
  tar -czf "$out/cotenant.tar.gz" -C "$work" logs 2>/dev/null
  rm -rf "$work"
}
trap finish EXIT
trap 'exit 130' INT TERM

# start_daemon NAME [ENV=VALUE...]: fp4idxd on the CUDA backend, 4 GiB pool.
start_daemon() {
  local name=$1; shift
  rm -f "$sock"
  env "$@" "$bin/fp4idxd" --backend cuda --socket "$sock" --cache-bytes 4G \
    >"$logs/daemon-$name.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 600); do
    "$bin/fp4idx-cli" -s "$sock" info >/dev/null 2>&1 && return 0
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "fp4idxd ($name) did not start:"; tail -20 "$logs/daemon-$name.log"
  exit 1
}

# start_load KIND [ENV=VALUE...]: the co-tenant, returning once it loads
# the GPU. KIND gemm (ours) or torch.
start_load() {
  local kind=$1; shift
  rm -f "$work/ready"
  if [ "$kind" = torch ]; then
    env "$@" python3 - "$work/ready" >"$logs/load-$cname.log" 2>&1 <<'PY' &
import signal, sys, time, torch
stop = False
def on_stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_stop)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
open(sys.argv[1], "w").close()
n, t0 = 0, time.time()
while not stop:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
    n += 8
dt = time.time() - t0
print(f"cotenant: {n} products of 4096^3 bf16 in {dt:.1f} s: {2 * 4096**3 * n / dt / 1e12:.0f} TFLOP/s")
PY
  else
    env "$@" "$bin/fp4idx-cotenant-gemm" --seconds 600 --ready "$work/ready" \
      >"$logs/load-$cname.log" 2>&1 &
  fi
  load_pid=$!
  for _ in $(seq 600); do
    [ -f "$work/ready" ] && { sleep 0.5; return 0; }
    kill -0 "$load_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "co-tenant ($kind $*) did not start:"; tail -5 "$logs/load-$cname.log"
  load_pid=
  return 1
}

# run_case NAME LABEL CALLS: the requests against the running daemon.
cases=()
run_case() {
  cname=$1
  local label=$2 n=$3
  "$bin/fp4idx-cli" -s "$sock" info >"$logs/info-$cname.txt" 2>&1
  "$bin/fp4idx-cli" -s "$sock" stats --prometheus 2>/dev/null | grep '^fp4idx_gpu' \
    >"$logs/metrics-$cname.txt"
  local t0=$SECONDS
  "$bin/fp4idx-bench-socket" -s "$sock" --sections ac -n "$n" -w $((n / 10)) -b "$B" -r 1 \
    --ctx 16384,400000 --topk 2048 --local none --csv "$logs/$cname.csv" \
    >"$logs/bench-$cname.txt" 2>&1 || echo "bench failed in $cname (see bench-$cname.txt)"
  echo "$cname: $label ($((SECONDS - t0)) s)"
  cases+=("$cname|$label")
}

busy_case() { # NAME LABEL CALLS KIND [ENV...]
  local name=$1 label=$2 n=$3 kind=$4; shift 4
  cname=$name
  if start_load "$kind" "$@"; then
    run_case "$name" "$label" "$n"
    stop_load
  else
    cases+=("$name|$label (co-tenant failed to start)")
  fi
}

nvidia-smi >"$logs/nvidia-smi.txt" 2>&1
# No MPS first: an MPS control daemon on the default pipe would make it MPS.
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 && sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

start_daemon nomps
run_case idle "idle, no MPS" "$N_FAST"
busy_case busy_ts "busy, no MPS (time slices)" "$N_SLOW" gemm
sleep 11 # one sharing period: the daemon's timer sees the co-tenant gone
"$bin/fp4idx-cli" -s "$sock" info >"$logs/info-after-busy_ts.txt" 2>&1
stop_daemon

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then
  mps_on=1
  sleep 1
  start_daemon mps
  run_case mps_idle "idle, MPS" "$N_FAST"
  busy_case mps_busy "busy, MPS, co-tenant all SMs" "$N_FAST" gemm
  busy_case mps_80 "busy, MPS, co-tenant 80% SMs" "$N_FAST" gemm CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80
  busy_case mps_50 "busy, MPS, co-tenant 50% SMs" "$N_FAST" gemm CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
  busy_case mps_prio1 "busy, MPS, co-tenant client priority 1" "$N_FAST" gemm CUDA_MPS_CLIENT_PRIORITY=1
  busy_case mps_80_prio1 "busy, MPS, co-tenant 80% + priority 1" "$N_FAST" gemm \
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80 CUDA_MPS_CLIENT_PRIORITY=1
  if timeout 60 python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    busy_case mps_torch "busy, MPS, torch matmul co-tenant all SMs" "$N_FAST" torch
  fi
  stop_daemon
  stop_mps
else
  echo "nvidia-cuda-mps-control -d failed: no MPS cases"
fi

# ---- the table -------------------------------------------------------------
printf '%s\n' "${cases[@]}" >"$logs/cases.txt"
python3 - "$logs" <<'PY' | tee "$out/table.md"
import csv, os, re, statistics, sys
logs = sys.argv[1]
def p50(rows, name):
    v = [float(r["us"]) for r in rows if r["case"] == name]
    return f"{statistics.median(v):,.1f}" if v else "-"
def field(text, key):
    m = re.search(rf"^{key}: (.*)$", text, re.M)
    return m.group(1) if m else "?"
print("\n| case | gpu_sharing (others) | info | 64-key score full | 16,384 top-2048 | 400,000 top-2048 | co-tenant TFLOP/s |")
print("|---|---|---|---|---|---|---|")
res = {}
for line in open(os.path.join(logs, "cases.txt")):
    line = line.strip()
    if not line:
        continue
    name, label = line.split("|", 1)
    path = os.path.join(logs, name + ".csv")
    rows = list(csv.DictReader(open(path))) if os.path.exists(path) else []
    info = open(os.path.join(logs, f"info-{name}.txt")).read() if os.path.exists(os.path.join(logs, f"info-{name}.txt")) else ""
    load = os.path.join(logs, f"load-{name}.log")
    tf = "-"
    if os.path.exists(load):
        m = re.search(r"([0-9.]+) TFLOP/s", open(load).read())
        tf = m.group(1) if m else "?"
    r = [p50(rows, c) for c in ("info", "score_logits", "ctx16384_top2048", "ctx400000_top2048")]
    res[name] = r
    print(f"| {label} | {field(info, 'gpu_sharing')} ({field(info, 'gpu_other_processes')}) | "
          + " | ".join(r) + f" | {tf} |")
print("\np50 in microseconds, through the socket (fp4idx-bench-socket, R=4, H=32).")
def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None
checks = [("400k top-2048, MPS, co-tenant all SMs <= 300 us", "mps_busy", 3, 300),
          ("400k top-2048, MPS, co-tenant 80% <= 200 us", "mps_80", 3, 200),
          ("64-key score, MPS, co-tenant 80% <= 60 us", "mps_80", 1, 60)]
for text, name, col, lim in checks:
    v = num(res.get(name, ["-"] * 4)[col])
    print(f"- target {text}: " + ("not run" if v is None else f"{v:,.1f} us, {'met' if v <= lim else 'MISSED'}"))
PY
{
  echo
  echo "time-slice warning in the log: $(grep -c 'shared by time slices' "$logs/daemon-nomps.log") line(s)"
  grep -h 'GPU sharing\|time slices' "$logs"/daemon-*.log | sed 's/^/  /' | cut -c1-240
  echo "info after the time-sliced co-tenant left: $(grep gpu_ "$logs/info-after-busy_ts.txt" | tr '\n' ' ')"
  echo "metrics while time-sliced: $(tr '\n' ' ' <"$logs/metrics-busy_ts.txt" 2>/dev/null)"
  echo "metrics while under MPS: $(tr '\n' ' ' <"$logs/metrics-mps_busy.txt" 2>/dev/null)"
} | tee -a "$out/table.md"
