#!/bin/bash
# topk_daemon.sh [BIN_DIR] [KEYS] [K] [CALLS] -- the daemon-side time of a
# top-k request (issue 17, "Done when"): starts fp4idxd --backend cuda on a
# private socket, appends KEYS random keys (default 400000), sends CALLS
# (default 50) score requests of 4 verify rows x 32 heads with --topk K
# (default 2048) through fp4idx-cli, then prints the daemon's `stats`
# (count and latency of the score op, measured inside the daemon).
#   bench/topk_daemon.sh build/daemon-and-cli-dir 400000 2048 50
set -euo pipefail
bin=${1:-build}
keys=${2:-400000}
k=${3:-2048}
calls=${4:-50}
daemon=$(find "$bin" -name fp4idxd -type f | head -1)
cli=$(find "$bin" -name fp4idx-cli -type f | head -1)
work=$(mktemp -d)
sock=$work/s.sock
"$daemon" --socket "$sock" --backend cuda --cache-bytes 1G --log-level warn 2>"$work/d.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 400); do "$cli" -s "$sock" info >/dev/null 2>&1 && break; sleep 0.05; done
"$cli" -s "$sock" append 1 --random "$keys" --seed 1 >/dev/null
perl -e 'srand(7); binmode STDOUT; for (1..4*32*128) { my $x = (int(rand(17)) - 8) / 8;
  print pack("v", unpack("V", pack("f<", $x)) >> 16) }' >"$work/q.bin"
perl -e 'srand(8); binmode STDOUT; for (1..4*32) { my $x = int(rand(9)) / 8;
  print pack("v", unpack("V", pack("f<", $x)) >> 16) }' >"$work/w.bin"
lens=$(seq -s, "$keys" -1 $((keys - 3)))
for _ in $(seq 1 "$calls"); do
  "$cli" -s "$sock" score 1 --q "$work/q.bin" --w "$work/w.bin" --heads 32 --lens "$lens" \
    --topk "$k" --format raw --out /dev/null
done
"$cli" -s "$sock" stats
