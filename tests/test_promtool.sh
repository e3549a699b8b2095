#!/usr/bin/env bash
# test_promtool.sh -- `promtool check metrics` (Prometheus' own linter) on
# what fp4idxd serves at --metrics-listen and on `fp4idx-cli stats
# --prometheus`, after traffic that fills every series (appends, a score,
# errors). Skips (77) where promtool is missing: Debian's package
# "prometheus" has it (apt-get install prometheus; not installed by
# deploy/install-deps.sh, it brings the whole server and its service).
#
#   test_promtool.sh FP4IDXD FP4IDX_CLI
set -u
daemon=$1
cli=$2
command -v promtool >/dev/null ||
  { echo "SKIP: promtool not installed (Debian package prometheus provides it)"; exit 77; }
tmp=$(mktemp -d /tmp/fp4idx-promtool-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/d.log" ] && cat "$tmp/d.log"; exit 1; }

sock=$tmp/d.sock
for try in 1 2 3 4 5; do  # a random high port; another try if it is taken
  port=$((20000 + RANDOM % 40000))
  "$daemon" --socket "$sock" --backend cpu --cache-bytes 16M --metrics-listen "127.0.0.1:$port" \
    2>"$tmp/d.log" &
  pid=$!
  for _ in $(seq 100); do
    [ -S "$sock" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  [ -S "$sock" ] && break
  wait "$pid" 2>/dev/null; pid=
done
[ -n "$pid" ] || fail "fp4idxd did not start"

"$cli" -s "$sock" append 1 --random 5000 --seed 1 >/dev/null || fail append
"$cli" -s "$sock" drop 42 2>/dev/null && fail "drop of an unknown sequence succeeded"
perl -e 'print pack("v*", (0x3f80) x (2*8*128))' >"$tmp/q.bin"
perl -e 'print pack("v*", (0x3f80) x (2*8))' >"$tmp/w.bin"
"$cli" -s "$sock" score 1 --q "$tmp/q.bin" --w "$tmp/w.bin" --heads 8 --topk 4 >/dev/null || fail score

# GET /metrics with bash's /dev/tcp (no curl needed); the body after the
# blank line.
exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "connect :$port"
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
cat <&3 >"$tmp/http.txt"
exec 3>&-
head -1 "$tmp/http.txt" | grep -q ' 200 ' || fail "status: $(head -1 "$tmp/http.txt")"
sed '1,/^\r$/d' "$tmp/http.txt" >"$tmp/scrape.prom"
grep -q '^fp4idx_keys_appended_total 5000$' "$tmp/scrape.prom" || fail "keys_appended"
grep -q '^fp4idx_errors_total{status="ENOSEQ"} 1$' "$tmp/scrape.prom" || fail "ENOSEQ counter"

promtool --version 2>&1 | head -1
promtool check metrics <"$tmp/scrape.prom" >"$tmp/lint" 2>&1 ||
  { cat "$tmp/lint"; fail "promtool on the scrape endpoint"; }
echo "ok: promtool check metrics: scrape endpoint clean ($(grep -c '^fp4idx' "$tmp/scrape.prom") samples)"
"$cli" -s "$sock" stats --prometheus >"$tmp/cli.prom" || fail "stats --prometheus"
promtool check metrics <"$tmp/cli.prom" >"$tmp/lint" 2>&1 ||
  { cat "$tmp/lint"; fail "promtool on fp4idx-cli stats --prometheus"; }
echo "ok: promtool check metrics: fp4idx-cli stats --prometheus clean"
kill -TERM "$pid"; wait "$pid"; code=$?; pid=
[ $code -eq 0 ] || fail "exit $code after SIGTERM"
echo "ok"
