#!/usr/bin/env bash
# test_man.sh -- the man pages keep up with the programs: every command that
# `fp4idx-cli --help` lists has its entry in fp4idx-cli(1), every option of
# `fp4idx-cli --help` and of each `fp4idx-cli COMMAND --help` is named in it,
# and every option of `fp4idxd --help` is named in fp4idxd(8). Where groff
# is installed, both pages also format with no warning.
#
#   test_man.sh MAN_DIR FP4IDXD FP4IDX_CLI
set -u
man=$1
daemon=$2
cli=$3
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

# The long options a --help text names (--xyz), one per line.
options() { grep -o -- '--[a-z][a-z-]*' | sort -u; }
# A man page names option --xyz-w as \-\-xyz\-w (roff's escaped hyphens);
# has_option TEXT OPTION.
has_option() { local e=${2//-/\\-}; printf "%s" "$1" | grep -qF -- "$e"; }
# entry PAGE COMMAND: the lines of COMMAND's entry (its .B/.BR line up to
# the next .TP or section).
entry() { awk -v c="$2" '$0 ~ "^\\.BR? " c "( |$)" {on = 1; print; next}
                         on && /^\.(TP|SH)/ {exit} on' "$1"; }

cli_help=$("$cli" --help) || { bad "fp4idx-cli --help failed"; cli_help=; }
commands=$(printf '%s\n' "$cli_help" | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF {print $1}')
[ -n "$commands" ] && ok "fp4idx-cli --help lists commands: $(echo $commands)" ||
  bad "no command list in fp4idx-cli --help"

page=$man/fp4idx-cli.1
for c in $commands; do
  text=$(entry "$page" "$c")
  if [ -n "$text" ]; then ok "fp4idx-cli(1) has command $c"
  else bad "fp4idx-cli(1) has no entry for command $c"; fi
  for o in $("$cli" "$c" --help 2>&1 | options); do
    [ "$o" = --help ] && continue
    if has_option "$text" "$o"; then ok "fp4idx-cli(1): $c names $o"
    else bad "fp4idx-cli(1): the entry of $c does not name $o"; fi
  done
done
for o in $(printf '%s\n' "$cli_help" | options); do
  has_option "$(cat "$page")" "$o" && ok "fp4idx-cli(1) names $o" ||
    bad "fp4idx-cli(1) does not name $o"
done

for o in $("$daemon" --help | options); do
  has_option "$(cat "$man/fp4idxd.8")" "$o" && ok "fp4idxd(8) names $o" ||
    bad "fp4idxd(8) does not name $o"
done

if command -v groff >/dev/null; then
  for p in "$man/fp4idx-cli.1" "$man/fp4idxd.8"; do
    w=$(groff -man -ww -z "$p" 2>&1)
    [ -z "$w" ] && ok "groff: $(basename "$p") formats cleanly" ||
      bad "groff warns on $(basename "$p"): $w"
  done
else
  echo "note: groff not installed, the formatting check is not run"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
