#!/usr/bin/env bash
# tests/run.sh -- the test command: installs what the build needs when it is
# missing (Debian packages, the Python test modules), configures, builds,
# runs ctest, and prints for every Criterion test program how many of its
# tests ran, passed, failed and were skipped (and why: "no GPU" for a GPU
# program on a machine without one), and pytest's summary line of the
# Python client suite (test_python).
#
#   tests/run.sh [extra cmake -D options...]
#
# Environment:
#   BUILD_DIR    build folder (default: build)
#   FP4IDX_CUDA  AUTO (default), ON or OFF -- passed to cmake
#   JOBS         parallel build jobs (default: nproc)
#   CTEST_ARGS   extra ctest arguments, e.g. "-L unit" or "-LE gpu"
#   NO_INSTALL   set to 1 to never call apt-get
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
FP4IDX_CUDA=${FP4IDX_CUDA:-AUTO}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# ---- dependencies ------------------------------------------------------------
# The package list lives in deploy/install-deps.sh (shared with quickstart).
if [[ "${NO_INSTALL:-0}" != 1 ]]; then
  bash deploy/install-deps.sh
fi

# The SASS check (tests/sass_check.sh) reads the scorer's machine code with
# cuobjdump (which calls nvdisasm); the CUDA toolkit on some machines lacks
# both. NVIDIA publishes them on PyPI (nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm, a few MB), so fetch them into the build folder when
# nvcc is here and cuobjdump is not.
if [[ "${NO_INSTALL:-0}" != 1 && "$FP4IDX_CUDA" != OFF && -z "${CUOBJDUMP:-}" ]] &&
   command -v nvcc >/dev/null 2>&1 && ! command -v cuobjdump >/dev/null 2>&1 &&
   [[ ! -x "$(dirname "$(command -v nvcc)")/cuobjdump" ]]; then
  tools="$BUILD_DIR/tools"
  if ! find "$tools" -name cuobjdump -type f 2>/dev/null | grep -q .; then
    python3 -m pip install -q --disable-pip-version-check --target "$tools" \
      nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null 2>&1 ||
      echo "tests/run.sh: could not fetch cuobjdump; the SASS check will skip"
  fi
  bin=$(find "$tools" -name cuobjdump -type f 2>/dev/null | head -n 1)
  if [[ -n "$bin" ]]; then
    bin=$(cd "$(dirname "$bin")" && pwd)
    export CUOBJDUMP="$bin/cuobjdump" PATH="$bin:$PATH"
  fi
fi

# ---- configure, build ------------------------------------------------------------
cmake -S . -B "$BUILD_DIR" -DFP4IDX_CUDA="$FP4IDX_CUDA" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"

# ---- test ------------------------------------------------------------------------
# The GPU programs' names (ctest label gpu), listed before the run: `ctest -N`
# rewrites the log that the summaries below read.
gpu_tests=" $( (cd "$BUILD_DIR" && ctest -N -L gpu 2>/dev/null) |
               awk '/Test +#[0-9]+:/ {printf "%s ", $3}')"
status=0
# shellcheck disable=SC2086
(cd "$BUILD_DIR" && ctest --output-on-failure ${CTEST_ARGS:-}) || status=$?

# Criterion's synthesis per test program, from ctest's full log, as "N of
# M run": M is the program's test count (`--list`), and the M - N tests its
# synthesis does not count were skipped (Criterion's synthesis counts only
# the tests that ran). A GPU program (ctest label gpu) skips its tests with
# cr_skip_test when no CUDA device answers (tests/common/test_gpu.h).
log="$BUILD_DIR/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]]; then
  have_gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    have_gpu=1
  fi
  echo
  echo "== Criterion synthesis =="
  T=0 R=0 P=0 F=0 C=0 S=0
  while IFS='|' read -r name cmd tested passing failing crashing; do
    total=$("$cmd" --list 2>/dev/null |
            awk '/^[^ ].*: [0-9]+ tests?$/ { s += $(NF - 1) } END { print s + 0 }')
    (( total >= tested )) || total=$tested
    skipped=$((total - tested))
    why=
    if (( skipped > 0 )); then
      why=" skipped"
      [[ $have_gpu == 0 && "$gpu_tests" == *" $name "* ]] && why=" skipped (no GPU)"
    fi
    printf "%-28s %d of %d run, %d passed, %d failed, %d crashed, %d%s\n" "$name" \
      "$tested" "$total" "$passing" "$failing" "$crashing" "$skipped" "${why:- skipped}"
    T=$((T + total)) R=$((R + tested)) P=$((P + passing)) F=$((F + failing))
    C=$((C + crashing)) S=$((S + skipped))
  done < <(sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
    /^[0-9]+\/[0-9]+ Testing: / { name = $3; cmd = "" }
    /^Command: / && cmd == "" { cmd = $2; gsub(/"/, "", cmd) }
    /Synthesis: Tested:/ {
      sub(/.*Synthesis: /, "")
      for (i = 1; i <= NF; i++) {
        if ($i == "Tested:") t = $(i + 1)
        if ($i == "Passing:") p = $(i + 1)
        if ($i == "Failing:") f = $(i + 1)
        if ($i == "Crashing:") c = $(i + 1)
      }
      printf "%s|%s|%d|%d|%d|%d\n", name, cmd, t, p, f, c
    }')
  printf "%-28s %d of %d run, %d passed, %d failed, %d crashed, %d skipped\n" "TOTAL" \
    "$R" "$T" "$P" "$F" "$C" "$S"
fi

# pytest's summary line of the Python client suite (test_python).
if [[ -f "$log" ]]; then
  summary=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
    /^[0-9]+\/[0-9]+ Testing: / { on = ($3 == "test_python") }
    on && /[0-9]+ (passed|failed|error|errors|skipped)/ && / in [0-9.]+s/ { line = $0 }
    END { print line }' | sed 's/^=* *//; s/ *=*$//')
  echo
  echo "== pytest (client/python) =="
  echo "test_python                  ${summary:-no summary (test_python did not run)}"
fi
exit "$status"
