#!/usr/bin/env bash
# install-deps.sh -- install the Debian/Ubuntu packages fp4idx builds with,
# only those missing, and the Python modules the Python client tests need
# (msgpack, numpy, pytest). Used by tests/run.sh and deploy/quickstart.sh.
#
#   deploy/install-deps.sh [--runtime]
#
# --runtime installs only what the built binaries need (no compilers, no test
# framework). Does nothing when everything is present; never upgrades.
set -euo pipefail

# systemd: systemd-analyze, systemd-socket-activate, systemd-sysusers and
# systemd-tmpfiles for the service tests (they skip without it). lintian:
# the Debian packages' check (tests/test_lintian.sh). clang + libclang-rt-dev
# (libFuzzer's runtime, only recommended by clang): the codec fuzzer that
# .ci/run runs (tests/fuzz/run.sh). python3: the build runs
# protocol/gen_optable.py (the op table turned into C). universal-ctags:
# .ci/check_source.py reads the definitions of the source with it.
build_pkgs=(cmake gcc make pkg-config python3 libuv1-dev libmsgpack-dev libcriterion-dev libsystemd-dev
            systemd libmicrohttpd-dev lintian clang libclang-rt-dev universal-ctags)
runtime_pkgs=(libuv1 libmsgpackc2 libmicrohttpd12)
pkgs=("${build_pkgs[@]}")
[ "${1:-}" = "--runtime" ] && pkgs=("${runtime_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# The Python client's tests (tests/python.cmake) run `python3 -m pytest` with
# msgpack and numpy. Debian's python3-* packages serve only the system
# interpreter (/usr/bin/python3, whose pip is externally managed); any other
# python3 on PATH (pyenv, a venv) gets them from PyPI with its own pip.
pip_missing=()
if [ "${1:-}" != "--runtime" ] && command -v python3 >/dev/null; then
  for m in msgpack numpy pytest; do
    python3 -c "import $m" 2>/dev/null || pip_missing+=("$m")
  done
  if [ ${#pip_missing[@]} -gt 0 ] &&
     [ "$(python3 -c 'import sys; print(sys.prefix == sys.base_prefix == "/usr")')" = True ]; then
    for m in "${pip_missing[@]}"; do missing+=("python3-$m"); done
    pip_missing=()
  fi
fi
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "install-deps: pip installing ${pip_missing[*]} for $(command -v python3)" >&2
  python3 -m pip install -q --disable-pip-version-check "${pip_missing[@]}"
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install-deps: missing ${missing[*]} and no apt-get here; install them by hand" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
