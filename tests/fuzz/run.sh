#!/usr/bin/env bash
# tests/fuzz/run.sh -- build the libFuzzer codec target with clang and run it
# for a bounded time on the committed corpus (what .ci/run does).
#
#   tests/fuzz/run.sh [SECONDS]      (default 60)
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), CC_FUZZ (default clang).
# New inputs go to a scratch folder; a crash leaves libFuzzer's crash-* file
# in FUZZ_BUILD_DIR/artifacts: copy it into tests/fuzz/regressions and fix
# the codec. Exit status: libFuzzer's (0 = no crash).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
cc=${CC_FUZZ:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "tests/fuzz/run.sh: $cc not found (deploy/install-deps.sh installs clang)" >&2
  exit 1
fi
cmake -S . -B "$dir" -DCMAKE_C_COMPILER="$cc" -DFP4IDX_LIBFUZZER=ON -DFP4IDX_CUDA=OFF \
  -DFP4IDX_WERROR=ON >/dev/null
cmake --build "$dir" --target fuzz_codec -j "${JOBS:-$(nproc 2>/dev/null || echo 2)}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$dir/artifacts"
"$dir/tests/fuzz_codec" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$dir/artifacts/" "$scratch" tests/fuzz/corpus tests/fuzz/regressions \
  2>&1 | tee "$dir/fuzz.log" | grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|Loaded [0-9]+ modules|^stat::|ERROR|SUMMARY|Done'
rc=${PIPESTATUS[0]}
# The codec must be instrumented, not only the harness (which alone has ~25
# counters): refuse a build whose coverage map is that small.
counters=$(sed -n 's/.*(\([0-9]*\) inline 8-bit counters).*/\1/p' "$dir/fuzz.log" | head -n 1)
if [[ "$rc" -eq 0 && "${counters:-0}" -lt 500 ]]; then
  echo "tests/fuzz/run.sh: only ${counters:-0} coverage counters: the codec is not instrumented" >&2
  rc=1
fi
exit "$rc"
