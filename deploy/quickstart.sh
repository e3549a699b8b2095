#!/usr/bin/env bash
# quickstart.sh -- fp4idx from nothing to scores, on this machine.
#
# Installs what is missing, builds, starts fp4idxd on a private socket (the
# CUDA backend when a GPU is present, else the CPU backend), injects 100,000
# keys with fp4idx-cli, scores 4 verify rows of 32 heads, prints the top-16
# positions of each row and the time of each step, stops the daemon, and
# prints where the binaries are and what to run next.
#
#   deploy/quickstart.sh            (env: BUILD_DIR, KEYS, HEADS, ROWS)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
keys=${KEYS:-100000}
heads=${HEADS:-32}
rows=${ROWS:-4}

now() { date +%s%N; }
step_start=0
step() { step_start=$(now); printf '%-44s' "$1" >&2; }
done_() { printf ' %8.1f ms\n' "$(( $(now) - step_start ))e-6" >&2; }

step "install missing packages"
bash "$root/deploy/install-deps.sh"
done_

mkdir -p "$build"; log="$build/quickstart-build.log"
step "configure + build ($build)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$log" 2>&1 ||
  { echo; cat "$log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1 ||
  { echo; tail -40 "$log" >&2; exit 1; }
done_

daemon="$build/daemon/fp4idxd"
cli="$build/client/fp4idx-cli"
work=$(mktemp -d)
sock="$work/fp4idxd.sock"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

step "start fp4idxd on a private socket"
"$daemon" --socket "$sock" --cache-bytes 256M 2>"$work/fp4idxd.log" &
pid=$!
for _ in $(seq 1 200); do
  "$cli" -s "$sock" info >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo; cat "$work/fp4idxd.log" >&2; exit 1; }
  sleep 0.05
done
done_
"$cli" -s "$sock" info | sed 's/^/    /' >&2

step "append $keys random keys (seq 1)"
"$cli" -s "$sock" append 1 --random "$keys" --seed 1 >/dev/null
done_

# Verify rows: q [rows, heads, 128] and w [rows, heads], bf16 little-endian,
# exact dyadic values k/8 (perl is part of every Debian/Ubuntu base system).
perl -e '
  my ($n, $seed) = @ARGV; srand($seed);
  binmode STDOUT;
  for (1..$n) {
    my $x = (int(rand(17)) - 8) / 8;
    print pack("v", unpack("V", pack("f<", $x)) >> 16);
  }' $((rows * heads * 128)) 7 >"$work/q.bin"
perl -e '
  my ($n, $seed) = @ARGV; srand($seed);
  binmode STDOUT;
  for (1..$n) {
    my $x = int(rand(9)) / 8;
    print pack("v", unpack("V", pack("f<", $x)) >> 16);
  }' $((rows * heads)) 8 >"$work/w.bin"
lens=$(seq -s, $keys -1 $((keys - rows + 1)))

step "score $rows rows x $heads heads, full logits"
"$cli" -s "$sock" score 1 --q "$work/q.bin" --w "$work/w.bin" --heads "$heads" \
  --lens "$lens" --format raw --out "$work/logits.f32"
done_

step "score $rows rows x $heads heads, top-16"
"$cli" -s "$sock" score 1 --q "$work/q.bin" --w "$work/w.bin" --heads "$heads" \
  --lens "$lens" --topk 16 --format text --out "$work/top16.txt"
done_

step "stop fp4idxd (SIGTERM)"
kill -TERM "$pid"
wait "$pid"
pid=""
done_

echo "top-16 (position:logit) of each verify row:"
cat "$work/top16.txt"

cat <<NEXT

The binaries are in $build:
  daemon   $daemon
  CLI      $cli
  library  $build/client/libfp4idx-client.so (headers: $build/include/fp4idx)
Next:
  # a daemon of your own, then the CLI ('fp4idx-cli help' lists the commands)
  $daemon --socket /tmp/fp4idxd.sock &
  $cli -s /tmp/fp4idxd.sock info
  # README.md "The library": a program against this build tree
  PKG_CONFIG_PATH=$build/pkgconfig cc app.c -o app \$(pkg-config --cflags --libs libfp4idx-client)
  # every test; the Debian packages (README.md "As a service")
  $root/tests/run.sh
  (cd $build && cpack -G DEB)
NEXT
