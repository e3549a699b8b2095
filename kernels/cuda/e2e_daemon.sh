#!/bin/bash
# e2e_daemon.sh [BACKEND...] -- fp4idxd end to end on the golden cases: for
# each backend (default: cpu cuda) start the daemon on a private socket,
# append each golden case's keys through fp4idx-cli, score full logits and
# top-64, and write the raw outputs; then compare every backend's bytes with
# the first one's and the logits with the float64 reference (*_ref.bin).
cd "$(dirname "$0")/../.." || exit 1
B=${B:-build-D}
OUT=${OUT:-/tmp/fp4idx_e2e}
mkdir -p "$OUT"
G=tests/golden
backends=${*:-cpu cuda}
cases="dyadic_h32:4:32:1000 gauss_h32:4:32:1000 gauss_h64:6:64:777"
lens_of() { python3 -c "import struct,sys;d=open(sys.argv[1],'rb').read();print(','.join(str(x) for x in struct.unpack('<%di'%(len(d)//4),d)))" "$1"; }
rc=0
for be in $backends; do
  sock=$OUT/$be.sock
  rm -f "$sock"
  $B/daemon/fp4idxd --socket "$sock" --backend "$be" --cache-bytes 64M --log-level warn \
    > "$OUT/daemon_$be.log" 2>&1 &
  pid=$!
  for i in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  $B/client/fp4idx-cli -s "$sock" info | tee "$OUT/info_$be.txt" | grep -E "backend|device"
  seq=1
  for c in $cases; do
    IFS=: read name R H n <<< "$c"
    $B/client/fp4idx-cli -s "$sock" append $seq $G/${name}_keys.bin --dtype bf16 > /dev/null || rc=1
    lens=$(lens_of $G/${name}_lens.bin)
    $B/client/fp4idx-cli -s "$sock" score $seq --q $G/${name}_q.bin --w $G/${name}_w.bin \
      --heads $H --lens "$lens" --format raw --out "$OUT/${be}_${name}_logits.bin" || rc=1
    $B/client/fp4idx-cli -s "$sock" score $seq --q $G/${name}_q.bin --w $G/${name}_w.bin \
      --heads $H --lens "$lens" --topk 64 --format raw --out "$OUT/${be}_${name}_top64.bin" || rc=1
    seq=$((seq + 1))
  done
  kill $pid; wait $pid 2>/dev/null
done
first=${backends%% *}
for be in $backends; do
  for c in $cases; do
    IFS=: read name R H n <<< "$c"
    for kind in logits top64; do
      if cmp -s "$OUT/${first}_${name}_$kind.bin" "$OUT/${be}_${name}_$kind.bin"; then
        echo "e2e $be $name $kind: same bytes as $first"
      else
        echo "e2e $be $name $kind: DIFFERS from $first"; rc=1
      fi
    done
    python3 - "$OUT/${be}_${name}_logits.bin" "$G/${name}_ref.bin" "$R" "$n" <<'PY' || rc=1
import struct, sys
got = open(sys.argv[1], 'rb').read(); ref = open(sys.argv[2], 'rb').read()
R, n = int(sys.argv[3]), int(sys.argv[4]); W = len(got) // 4 // R
bad = sum(got[4 * (r * W + l):4 * (r * W + l) + 4] != ref[4 * (r * n + l):4 * (r * n + l) + 4]
          for r in range(R) for l in range(W))
print(f"e2e {sys.argv[1].split('/')[-1]}: {bad} of {R * W} logits differ from the float64 reference")
sys.exit(1 if bad else 0)
PY
  done
done
echo "e2e rc=$rc"
exit $rc
