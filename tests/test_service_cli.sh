#!/usr/bin/env bash
# test_service_cli.sh -- fp4idx-cli save/export/import against the real
# daemon: an exported sequence imported under another id reads back byte for
# byte; the file's pages have SGLang's layout (key 0's payload right after the
# 64-byte header, its scales after the page's P payloads); raw pages import
# with --count/--page-size; a forked sequence (fp4idx-cli fork) exports its
# whole key list, shared prefix included; save writes the snapshot; errors
# are one line.
#
#   test_service_cli.sh FP4IDXD FP4IDX_CLI
set -u
daemon=$1
cli=$2
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
tmp=$(mktemp -d /tmp/fp4idx-svccli-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/d.sock
"$daemon" --backend cpu --cache-bytes 32M --page-size 16 --socket "$sock" \
  --data-dir "$tmp/data" >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
c() { "$cli" -s "$sock" "$@"; }

c append 5 --random 100 --seed 9 >/dev/null && ok "append" || bad "append"
c read 5 --out "$tmp/orig.bin" >/dev/null || bad "read"
c export 5 "$tmp/s5.fp4x" >/dev/null && ok "export" || bad "export"
# 64-byte header + 7 pages of 16 keys * 68 bytes.
[ "$(stat -c %s "$tmp/s5.fp4x")" = $((64 + 7 * 16 * 68)) ] && ok "export size" || bad "export size $(stat -c %s "$tmp/s5.fp4x")"
# SGLang layout: key 0 payload at 64, key 0 scales at 64 + 16*64; key 17
# (page 1, slot 1) payload at 64 + 1088 + 64.
cmp -s <(head -c 64 "$tmp/orig.bin") <(tail -c +65 "$tmp/s5.fp4x" | head -c 64) && ok "key 0 payload" || bad "key 0 payload"
cmp -s <(tail -c +65 "$tmp/orig.bin" | head -c 4) <(tail -c +$((64 + 16 * 64 + 1)) "$tmp/s5.fp4x" | head -c 4) && ok "key 0 scales" || bad "key 0 scales"
cmp -s <(tail -c +$((17 * 68 + 1)) "$tmp/orig.bin" | head -c 64) <(tail -c +$((64 + 1088 + 64 + 1)) "$tmp/s5.fp4x" | head -c 64) && ok "key 17 payload" || bad "key 17 payload"

out=$(c import 6 "$tmp/s5.fp4x") && echo "$out" | grep -q "imported 100 keys" && ok "import" || bad "import: $out"
c read 6 --out "$tmp/back.bin" >/dev/null
cmp -s "$tmp/orig.bin" "$tmp/back.bin" && ok "import round trip" || bad "import differs"

c export 5 "$tmp/s5.raw" --raw --page-size 64 >/dev/null && [ "$(stat -c %s "$tmp/s5.raw")" = $((2 * 64 * 68)) ] && ok "raw export" || bad "raw export"
c import 7 "$tmp/s5.raw" --raw --count 100 --page-size 64 >/dev/null && ok "raw import" || bad "raw import"
c read 7 --out "$tmp/back7.bin" >/dev/null
cmp -s "$tmp/orig.bin" "$tmp/back7.bin" && ok "raw round trip" || bad "raw differs"

# fork: seq 9 = the first 40 keys of seq 5 (shared pages) + 10 keys of its
# own; its export equals that of seq 10 = the same keys appended unshared.
out=$(c fork 5 9 40) && echo "$out" | grep -q "seq 9: length 40" && ok "fork" || bad "fork: $out"
c append 9 --random 10 --seed 4 >/dev/null && c read 9 --out "$tmp/s9.bin" >/dev/null || bad "fork append"
cmp -s <(head -c $((40 * 68)) "$tmp/orig.bin") <(head -c $((40 * 68)) "$tmp/s9.bin") && ok "fork keeps the prefix" || bad "fork prefix"
c append 10 "$tmp/s9.bin" --dtype fp4 >/dev/null || bad "append copy"
c export 9 "$tmp/s9.raw" --raw >/dev/null && c export 10 "$tmp/s10.raw" --raw >/dev/null &&
  [ "$(stat -c %s "$tmp/s9.raw")" = $((4 * 16 * 68)) ] && cmp -s "$tmp/s9.raw" "$tmp/s10.raw" &&
  ok "fork exports its full key list" || bad "fork export"
c read 5 --out "$tmp/orig_after.bin" >/dev/null && cmp -s "$tmp/orig.bin" "$tmp/orig_after.bin" && ok "source unchanged" || bad "source changed"
err=$(c fork 5 9 1 2>&1 >/dev/null); code=$?
[ $code -eq 1 ] && echo "$err" | grep -q "EEXIST" && ok "fork to an existing seq: $err" || bad "fork EEXIST: $code $err"
c stats | grep -q "^pages_shared: [1-9]" && ok "stats pages_shared" || bad "stats pages_shared"

# A corrupted export file is refused with a one-line error and changes nothing.
cp "$tmp/s5.fp4x" "$tmp/bad.fp4x"
printf '\xff' | dd of="$tmp/bad.fp4x" bs=1 seek=500 conv=notrunc 2>/dev/null
err=$(c import 8 "$tmp/bad.fp4x" 2>&1 >/dev/null); code=$?
[ $code -eq 1 ] && echo "$err" | grep -q "ECORRUPT" && [ "$(echo "$err" | wc -l)" = 1 ] && ok "corrupt file refused: $err" || bad "corrupt: $code $err"
c read 8 --out "$tmp/x.bin" >/dev/null 2>&1 && bad "seq 8 exists" || ok "nothing imported"

c save >/dev/null && [ -f "$tmp/data/snapshot.fp4s" ] && ok "save" || bad "save"
kill -TERM $pid; wait $pid; code=$?; pid=
[ $code -eq 0 ] && ok "daemon exit 0" || bad "daemon exit $code"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
