#!/usr/bin/env bash
# tests/run.sh -- the test command: installs what the build needs when it is
# missing (Debian packages, the Python test modules), configures, builds,
# runs ctest, and prints Criterion's synthesis line of every test program
# and pytest's summary line of the Python client suite (test_python).
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
status=0
# shellcheck disable=SC2086
(cd "$BUILD_DIR" && ctest --output-on-failure ${CTEST_ARGS:-}) || status=$?

# Criterion's synthesis per test program, from ctest's full log.
log="$BUILD_DIR/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]]; then
  echo
  echo "== Criterion synthesis =="
  sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
    /^[0-9]+\/[0-9]+ Testing: / { name = $3 }
    /Synthesis: Tested:/ {
      sub(/.*Synthesis: /, "");
      printf "%-28s %s\n", name, $0
      for (i = 1; i <= NF; i++) {
        if ($i == "Tested:") t += $(i + 1)
        if ($i == "Passing:") p += $(i + 1)
        if ($i == "Failing:") f += $(i + 1)
        if ($i == "Crashing:") c += $(i + 1)
      }
    }
    END { printf "%-28s Tested: %d | Passing: %d | Failing: %d | Crashing: %d\n", "TOTAL", t, p, f, c }'
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
