"""The "length" op through the Python client's generic call and the CLI's
table commands: neither has code of its own for it, the op table is all
they know of it. c.length(seq=...) is c.call("length", seq=...) and returns
the key count; it follows appends and truncates, pipelines, routes by seq
in the sharded client, and an unknown sequence raises NoSequence.
`fp4idx-cli length SEQ` prints "length N"."""
import numpy as np
import pytest

import fp4idx
from conftest import cli


def keys(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 128)).astype(np.float32)


def test_length_follows_the_sequence(make_daemon):
    d = make_daemon(cache_bytes="16M")
    with fp4idx.Client(d.socket, timeout=30) as c:
        with pytest.raises(fp4idx.NoSequence):
            c.length(seq=3)
        c.append(3, keys(90))
        assert c.length(seq=3) == 90
        assert c.call("length", seq=3) == 90
        c.truncate(3, 25)
        assert c.length(seq=3) == 25
        with pytest.raises(fp4idx.InvalidArgument):
            c.length()  # seq is required: refused before sending
        with c.pipeline() as p:
            p.append(4, keys(7)).length(seq=4)
            assert p.execute() == [(0, 7), 7]


def test_sharded_length_goes_to_the_sequences_shard(make_daemon):
    ds = [make_daemon(cache_bytes="16M") for _ in range(2)]
    with fp4idx.ShardedClient([d.socket for d in ds], timeout=30) as sc:
        for s in range(8):
            sc.append(s, keys(s + 1, s))
        assert [sc.length(seq=s) for s in range(8)] == list(range(1, 9))


def test_cli_length(make_daemon):
    d = make_daemon(cache_bytes="16M")
    with fp4idx.Client(d.socket, timeout=30) as c:
        c.append(11, keys(33))
    assert cli(d.socket, "length", 11).stdout == b"length 33\n"
    p = cli(d.socket, "length", 12, check=False)
    assert p.returncode == 1
    assert b"(ENOSEQ)" in p.stderr and b"12" in p.stderr
    p = cli(d.socket, "length", check=False)
    assert p.returncode == 2 and b"expected SEQ" in p.stderr
    assert b"length SEQ" in cli(d.socket, "--help").stdout
    assert b"usage: fp4idx-cli [-s SOCKET] length SEQ" in cli(d.socket, "help", "length").stdout
