#!/bin/bash
# run_channel.sh -- what a score costs as seen by the client's CUDA stream,
# channel against socket (fp4idx-bench-channel: 400,000 keys top-2048, 64
# keys full logits, a captured graph of 61 calls), for docs/RESULTS.md
# ("Channels"): the new build and the previous one, runs alternated, each
# against a fresh `fp4idxd --backend cuda` of its own build.
#
#   bench/run_channel.sh NEW_DIR [PREV_DIR]
#
# A DIR holds fp4idxd, fp4idx-cli and fp4idx-bench-channel of one build (the
# benchmark carries that build's client library); DIR/devlib, when present,
# goes first on LD_LIBRARY_PATH (libraries the host lacks).
# MPS: 1 (the default where nvidia-cuda-mps-control is on PATH and this
#   runs as root) starts an MPS control daemon for the run and quits it at
#   the end; 0 runs without (the client's stream and the daemon's kernels
#   then take turns by time slice: milliseconds, see the results page).
# RUNS (default 3): runs per build, alternated; CALLS (400) and WARM (40):
#   fp4idx-bench-channel -n / -w.
# Output in $OUT (default /tmp/channel_out): channel.BUILD.RUN.log,
# daemon.BUILD.RUN.log, gpu.txt, table.txt; the table is printed last: per
# case and path, p50 and p50 minus the daemon's kernel time ("added"), as
# min-max over the runs.
set -u
NEW=${1:?usage: run_channel.sh NEW_DIR [PREV_DIR]}
PREV=${2:-}
OUT=${OUT:-/tmp/channel_out}
RUNS=${RUNS:-3}
CALLS=${CALLS:-400}
WARM=${WARM:-40}
mkdir -p "$OUT"
for d in "$NEW" ${PREV:+"$PREV"}; do
  for f in fp4idxd fp4idx-cli fp4idx-bench-channel; do
    [ -x "$d/$f" ] || { echo "run_channel.sh: $d/$f is missing" >&2; exit 1; }
  done
done
if [ -z "${MPS:-}" ]; then
  MPS=0
  [ "$(id -u)" = 0 ] && command -v nvidia-cuda-mps-control > /dev/null && MPS=1
fi
work=$(mktemp -d /tmp/fp4idx-channel-XXXXXX)
sock=$work/d.sock
daemon_pid=
mps_on=0
finish() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; fi
  if [ "$mps_on" = 1 ]; then echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 1; fi
  rm -rf "$work"
}
trap finish EXIT
trap 'exit 130' INT TERM

nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ "$MPS" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "run_channel.sh: MPS did not start" >&2; exit 1; }
  mps_on=1
  sleep 1
fi
echo "MPS: $MPS" >> "$OUT/gpu.txt"

# one BUILD RUN: a fresh daemon of the build, its benchmark against it
one() {
  local build=$1 run=$2 dir
  dir=$(cd "$([ "$build" = new ] && echo "$NEW" || echo "$PREV")" && pwd)
  local lib="$dir/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  rm -f "$sock"
  LD_LIBRARY_PATH=$lib "$dir/fp4idxd" --backend cuda --socket "$sock" --cache-bytes 8G \
    > "$OUT/daemon.$build.$run.log" 2>&1 &
  daemon_pid=$!
  local up=0
  for _ in $(seq 600); do
    LD_LIBRARY_PATH=$lib "$dir/fp4idx-cli" -s "$sock" info > /dev/null 2>&1 && { up=1; break; }
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ $up = 1 ]; then
    LD_LIBRARY_PATH=$lib "$dir/fp4idx-bench-channel" -s "$sock" -n "$CALLS" -w "$WARM" \
      > "$OUT/channel.$build.$run.log" 2>&1
    echo "$build run $run: rc=$?"
  else
    echo "$build run $run: fp4idxd did not start (daemon.$build.$run.log)"
  fi
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=
}
for run in $(seq "$RUNS"); do
  [ -n "$PREV" ] && one prev "$run"
  one new "$run"
done

# The table: fp4idx-bench-channel's rows are "CASE PATH p50 p90 kernels
# added"; per case and path, the previous build's line then the new one's.
{
  echo
  echo "== fp4idx-bench-channel ($(head -1 "$OUT/gpu.txt"), MPS $MPS), $RUNS runs each, p50 us (added = p50 - kernels), min-max"
  for f in "$OUT"/channel.*.log; do
    [ -f "$f" ] || continue
    b=$(basename "$f" | cut -d. -f2)
    awk -v b="$b" 'NF >= 6 && $NF ~ /^[0-9.]+$/ && $(NF-3) ~ /^[0-9.]+$/ {
        path = $(NF-4); ce = NF - 5
        if (path == "region" && $(NF-5) == "cuda") { path = "cuda region"; ce = NF - 6 }
        c = $1; for (i = 2; i <= ce; i++) c = c " " $i
        print c "|" path "|" b "|" $(NF-3) "|" $NF }' "$f"
  done | awk -F'|' '
    { k = $1 "|" $2
      if (!(k in seen)) { seen[k] = 1; order[++m] = k }
      kb = k "|" $3
      if (!(kb in n)) { lo[kb] = hi[kb] = $4; alo[kb] = ahi[kb] = $5 }
      n[kb]++
      if ($4 + 0 < lo[kb] + 0) lo[kb] = $4
      if ($4 + 0 > hi[kb] + 0) hi[kb] = $4
      if ($5 + 0 < alo[kb] + 0) alo[kb] = $5
      if ($5 + 0 > ahi[kb] + 0) ahi[kb] = $5 }
    END {
      printf "%-36s %-14s %-5s %14s %14s\n", "case", "path", "build", "p50", "added"
      for (i = 1; i <= m; i++) {
        split(order[i], p, "|")
        for (j = 1; j <= 2; j++) {
          b = j == 1 ? "prev" : "new"; kb = order[i] "|" b
          if (kb in n)
            printf "%-36s %-14s %-5s %14s %14s\n", p[1], p[2], b, lo[kb] "-" hi[kb], alo[kb] "-" ahi[kb]
        } } }'
} | tee "$OUT/table.txt"
