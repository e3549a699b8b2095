#!/bin/bash
# e2e_daemon.sh FP4IDXD FP4IDX_CLI GOLDEN_DIR WORK_DIR -- fp4idxd end to end
# on the golden cases (ctest test_e2e_daemon_cuda, label gpu): for the cpu
# and the cuda backend start the daemon on a private socket, append each
# golden case's keys through fp4idx-cli, score full logits and top-64, then
# require the cuda bytes == the cpu bytes and the logits == the float64
# reference (*_ref.bin). Exit 77 (ctest: skipped) when the cuda backend finds
# no GPU; any other failure is exit 1.
daemon=$1 cli=$2 G=$3 OUT=$4
[ -x "$daemon" ] && [ -x "$cli" ] && [ -d "$G" ] && [ -n "$OUT" ] ||
  { echo "usage: e2e_daemon.sh FP4IDXD FP4IDX_CLI GOLDEN_DIR WORK_DIR"; exit 1; }
mkdir -p "$OUT" || exit 1
backends="cpu cuda"
cases="dyadic_h32:4:32:1000 gauss_h32:4:32:1000 gauss_h64:6:64:777"
lens_of() { od -An -v -t d4 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//; s/ /,/g'; }
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT
rc=0
for be in $backends; do
  sock=$OUT/$be.sock
  rm -f "$sock"
  "$daemon" --socket "$sock" --backend "$be" --cache-bytes 64M --log-level info \
    > "$OUT/daemon_$be.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    [ -S "$sock" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -S "$sock" ]; then
    wait $pid 2>/dev/null
    pid=
    if [ "$be" = cuda ] && grep -qE "CUDA backend unavailable" "$OUT/daemon_$be.log"; then
      echo "e2e: no GPU for the cuda backend, skipped"; cat "$OUT/daemon_$be.log"; exit 77
    fi
    echo "e2e: fp4idxd --backend $be did not start:"; cat "$OUT/daemon_$be.log"; exit 1
  fi
  "$cli" -s "$sock" info > "$OUT/info_$be.txt" || rc=1
  grep -E "backend|device" "$OUT/info_$be.txt"
  seq=1
  for c in $cases; do
    IFS=: read -r name R H n <<< "$c"
    "$cli" -s "$sock" append $seq "$G/${name}_keys.bin" --dtype bf16 > /dev/null || rc=1
    lens=$(lens_of "$G/${name}_lens.bin")
    "$cli" -s "$sock" score $seq --q "$G/${name}_q.bin" --w "$G/${name}_w.bin" --heads "$H" \
      --lens "$lens" --format raw --out "$OUT/${be}_${name}_logits.bin" || rc=1
    "$cli" -s "$sock" score $seq --q "$G/${name}_q.bin" --w "$G/${name}_w.bin" --heads "$H" \
      --lens "$lens" --topk 64 --format raw --out "$OUT/${be}_${name}_top64.bin" || rc=1
    seq=$((seq + 1))
  done
  kill $pid; wait $pid 2>/dev/null
  pid=
done
for c in $cases; do
  IFS=: read -r name R H n <<< "$c"
  for kind in logits top64; do
    if cmp -s "$OUT/cpu_${name}_$kind.bin" "$OUT/cuda_${name}_$kind.bin"; then
      echo "e2e cuda $name $kind: same bytes as cpu"
    else
      echo "e2e cuda $name $kind: DIFFERS from cpu"; rc=1
    fi
  done
  # logits [R, W] (W = the widest row) against the reference [R, n]
  got=$OUT/cuda_${name}_logits.bin
  W=$(( $(stat -c %s "$got") / 4 / R ))
  bad=0
  for r in $(seq 0 $((R - 1))); do
    cmp -s -i $((r * W * 4)):$((r * n * 4)) -n $((W * 4)) "$got" "$G/${name}_ref.bin" ||
      bad=$((bad + 1))
  done
  echo "e2e cuda $name: $bad of $R rows differ from the float64 reference"
  [ $bad -eq 0 ] || rc=1
done
echo "e2e rc=$rc"
exit $rc
