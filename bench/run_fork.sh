#!/usr/bin/env bash
# run_fork.sh -- fp4idx-bench-fork in process, then through a fresh fp4idxd
# on the CPU backend (temporary socket, 1 GiB pool), the figures of
# docs/RESULTS.md "Prefix sharing". Usage: bench/run_fork.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
tmp=$(mktemp -d /tmp/fp4idx-benchfork-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
"$build/bench/fp4idx-bench-fork"
echo
"$build/daemon/fp4idxd" --backend cpu --cache-bytes 1G --socket "$tmp/d.sock" \
  --log-level warn 2>"$tmp/log" &
pid=$!
for _ in $(seq 200); do [ -S "$tmp/d.sock" ] && break; sleep 0.05; done
"$build/bench/fp4idx-bench-fork" -s "$tmp/d.sock"
kill -TERM $pid
wait $pid
pid=
