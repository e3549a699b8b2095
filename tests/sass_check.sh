#!/bin/sh
# sass_check.sh OBJECT... -- the scorer's machine code must use tensor cores
# (HMMA or HGMMA) and no MUFU.EX2 (exp2 on the special-function unit), for
# every architecture in the fat binary. Exit 77 (ctest: skipped) when no
# cuobjdump is available.
tool="${CUOBJDUMP:-}"
[ -z "$tool" ] && tool=$(command -v cuobjdump 2>/dev/null)
[ -z "$tool" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && tool=/usr/local/cuda/bin/cuobjdump
if [ -z "$tool" ]; then echo "sass_check: no cuobjdump, skipped"; exit 77; fi
set -- $(printf "%s " "$@" | tr ";" " ")
sass=""
for obj in "$@"; do
  [ -f "$obj" ] || { echo "sass_check: no object $obj"; exit 1; }
  one=$("$tool" -sass "$obj" 2>&1) || { echo "sass_check: cuobjdump failed: $one"; exit 1; }
  sass="$sass
$one"
done
archs=$(printf '%s\n' "$sass" | grep -o 'arch = sm_[0-9a-z]*' | sort -u | tr '\n' ' ')
[ -n "$archs" ] || { echo "sass_check: no SASS in $*"; exit 1; }
rc=0
for a in $archs; do :; done
# Split per architecture section ("Fatbin elf code" ... "arch = sm_XX").
printf '%s\n' "$sass" | awk '
  /arch = sm_/ { arch = $3 }
  /Function : / { fn = $3 }
  /HMMA|HGMMA/ { if (fn ~ /score/) mma[arch]++ }
  /MUFU\.EX2/ { ex2[arch]++ }
  END {
    bad = 0; n = 0
    for (a in mma) { n++; printf "sass_check: %s: %d tensor-core instructions in the scorer, %d MUFU.EX2\n", a, mma[a], ex2[a] + 0; if (ex2[a] > 0) bad = 1 }
    for (a in ex2) if (!(a in mma)) { printf "sass_check: %s: MUFU.EX2 present, no tensor-core op\n", a; bad = 1 }
    if (n == 0) { print "sass_check: no HMMA/HGMMA in the scorer"; bad = 1 }
    exit bad
  }' || rc=1
exit $rc
