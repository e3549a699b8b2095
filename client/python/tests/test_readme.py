"""The README's examples (client/python/README.md, and the Python one of
the top README.md) run as written against real daemons, and print what
their comments say."""
import os
import re
import subprocess
import sys

import pytest

from conftest import PKG, REPO, Daemon


def blocks():
    out = []
    for path in (os.path.join(PKG, "README.md"), os.path.join(REPO, "README.md")):
        out += re.findall(r"```python\n(.*?)```", open(path).read(), re.S)
    return out


def expected(code):
    """The comment of each print(...) line (None where there is none), in order."""
    out = []
    for line in code.splitlines():
        if line.strip().startswith("print("):
            m = re.search(r"\)\s+#\s(.*)$", line)
            out.append(m.group(1).strip() if m else None)
    return out


def runnable(torch):
    """The examples that import fp4idx: those that also import torch
    (torch=True, the CUDA ones) or the others."""
    return [b for b in blocks() if re.search(r"^import .*\bfp4idx\b", b, re.M)
            and bool(re.search(r"^import torch", b, re.M)) == torch]


def test_readme_examples_run(make_daemon):
    assert len(runnable(False)) >= 6
    one = make_daemon()
    shards = [make_daemon() for _ in range(3)]
    run_blocks(runnable(False), one, shards)


def test_readme_cuda_examples_run():
    """The torch/CUDA examples against a CUDA daemon (torch and a GPU only)."""
    blocks_ = runnable(True)
    assert blocks_
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = Daemon(cache_bytes="1G", backend="cuda")
    try:
        run_blocks(blocks_, d, [])
    finally:
        d.close()


def run_blocks(blocks_, one, shards):
    env = dict(os.environ, FP4IDX_SOCKET=one.socket,
               FP4IDX_SHARDS=",".join(d.socket for d in shards),
               PYTHONPATH=PKG + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for code in blocks_:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"README example failed:\n{code}\n{p.stderr}"
        lines = p.stdout.splitlines()
        want = expected(code)
        assert len(lines) == len(want), (code, p.stdout)
        for got, exp in zip(lines, want):
            if exp is not None:
                assert got == exp, (code, got, exp)
