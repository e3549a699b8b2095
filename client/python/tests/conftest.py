"""Fixtures: real CPU fp4idxd daemons on temporary sockets, and fp4idx-cli.

Binaries come from the build folder: $FP4IDXD and $FP4IDX_CLI when set
(tests/python.cmake passes them), else $FP4IDX_BUILD_DIR/{daemon/fp4idxd,
client/fp4idx-cli}, else build/ at the repository root. The package is
the installed one when there is one (ctest puts this checkout first on
PYTHONPATH), else this checkout's.
"""
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
try:  # an installed fp4idx (pip install ./client/python), else this checkout
    import fp4idx  # noqa: F401
except ImportError:
    sys.path.insert(0, PKG)

BUILD = os.environ.get("FP4IDX_BUILD_DIR", os.path.join(REPO, "build"))
FP4IDXD = os.environ.get("FP4IDXD", os.path.join(BUILD, "daemon", "fp4idxd"))
FP4IDX_CLI = os.environ.get("FP4IDX_CLI", os.path.join(BUILD, "client", "fp4idx-cli"))
GOLDEN = os.environ.get("FP4IDX_GOLDEN_DIR", os.path.join(REPO, "tests", "golden"))


class Daemon:
    """One fp4idxd process (CPU backend unless told) on a socket in a
    temporary folder."""

    def __init__(self, cache_bytes="16M", extra=(), backend="cpu"):
        if not os.access(FP4IDXD, os.X_OK):
            pytest.fail(f"fp4idxd not built at {FP4IDXD} (set FP4IDX_BUILD_DIR)")
        self.dir = tempfile.mkdtemp(prefix="fp4idx-py-")
        self.socket = os.path.join(self.dir, "fp4idxd.sock")
        self.args = [FP4IDXD, "--socket", self.socket, "--backend", backend,
                     "--cache-bytes", cache_bytes, "--threads", "2",
                     "--log-level", "error", *extra]
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"fp4idxd exited with {self.proc.returncode}: {self.args}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        pytest.fail("fp4idxd did not open its socket within 20 s")

    def stop(self):
        """SIGTERM, wait -> the exit status (the daemon must exit 0: a crash,
        or a sanitizer report in the ASan build, fails the test)."""
        p, self.proc = self.proc, None
        if p is None:
            return 0
        if p.poll() is not None:
            raise AssertionError(f"fp4idxd died during the test (status {p.returncode})")
        p.terminate()
        try:
            rc = p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError("fp4idxd did not stop within 30 s of SIGTERM")
        assert rc == 0, f"fp4idxd exited with status {rc}"
        return rc

    def close(self):
        """stop(), then remove the temporary folder (a stopped daemon may be
        started again; a closed one may not)."""
        try:
            return self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(cache_bytes=..., extra=[...]) -> a started Daemon,
    stopped at the end of the test."""
    made = []

    def make(**kw):
        d = Daemon(**kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


@pytest.fixture(scope="session")
def daemon():
    """One daemon shared by the tests of the session (tests use distinct
    sequence ids)."""
    d = Daemon(cache_bytes="64M")
    yield d
    d.close()


@pytest.fixture
def client(daemon):
    import fp4idx
    with fp4idx.Client(daemon.socket, timeout=60) as c:
        yield c


_next_seq = [1000]


@pytest.fixture
def seq():
    """A sequence id no other test uses (factory: seq() -> int)."""
    def new():
        _next_seq[0] += 1
        return _next_seq[0]
    return new


def cli(sock, *args, check=True):
    """Runs fp4idx-cli against `sock` -> CompletedProcess (bytes)."""
    if not os.access(FP4IDX_CLI, os.X_OK):
        pytest.fail(f"fp4idx-cli not built at {FP4IDX_CLI}")
    p = subprocess.run([FP4IDX_CLI, "-s", sock, *map(str, args)],
                       capture_output=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"fp4idx-cli {args}: {p.stderr.decode()}")
    return p


def wait_until(cond, what, deadline_s=30):
    """Until cond() holds (an event another thread or process makes
    happen); fails with `what` after deadline_s, so a lost event cannot
    hang the suite."""
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.001)


def stop_daemon(d):
    """SIGSTOP daemon `d`, and until every thread of it has stopped (kill
    returns before the signal has taken effect)."""
    os.kill(d.proc.pid, signal.SIGSTOP)
    task = f"/proc/{d.proc.pid}/task"

    def stopped():
        states = []
        for t in os.listdir(task):
            with open(f"{task}/{t}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        return all(st in ("T", "t") for st in states)
    wait_until(stopped, "the daemon did not stop")
