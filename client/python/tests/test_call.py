"""The generic call of any op of the op table (protocol/optable.py): the
fields are checked against the table before anything is sent, the reply
comes back as the dict of its fields, and pipelines and the sharded client
run it like the named methods."""
import numpy as np
import pytest

import fp4idx
from fp4idx import ops
from fp4idx.optable import OPS


def test_the_table_holds_every_op_the_methods_send():
    for name in ("hello", "info", "append", "score", "truncate", "drop", "fork", "read",
                 "stats", "save", "list", "register", "unregister"):
        assert name in OPS, name
    assert OPS["score"]["request"][0] == {"name": "heads", "kind": "u32", "required": True,
                                          "min": 1, "max": 128}


def test_fields_are_checked_before_sending():
    with pytest.raises(fp4idx.InvalidArgument, match="unknown op"):
        ops.call("nope", {})
    with pytest.raises(fp4idx.InvalidArgument, match="missing field 'seq'"):
        ops.call("truncate", {"length": 1})
    with pytest.raises(fp4idx.InvalidArgument, match="unknown fields"):
        ops.call("truncate", {"seq": 1, "length": 1, "len": 2})
    with pytest.raises(fp4idx.InvalidArgument, match="1..10000"):
        ops.call("list", {"count": 0})
    with pytest.raises(fp4idx.InvalidArgument, match="must be an int"):
        ops.call("drop", {"seq": "7"})
    with pytest.raises(fp4idx.InvalidArgument, match="one of"):
        ops.call("append", {"seq": 1, "keys": np.zeros((1, 128), np.float32),
                            "rounding": "up"})
    r = ops.call("read", {"seq": 3, "from_": 2, "dequant": True})
    assert (r.op, r.fields, r.seq) == ("read", {"seq": 3, "from": 2, "dequant": True}, 3)


def test_call_runs_ops_like_their_methods(make_daemon):
    d = make_daemon(cache_bytes="16M")
    keys = np.random.default_rng(1).standard_normal((100, 128)).astype(np.float32)
    with fp4idx.Client(d.socket, timeout=30) as c:
        assert c.call("append", seq=5, keys=keys) == {"first": 0, "length": 100}
        assert c.call("truncate", seq=5, length=40) == {"length": 40}
        assert c.call("info")["sequences"] == 1
        assert c.call("drop", seq=5) is None
        with pytest.raises(fp4idx.NoSequence):
            c.call("drop", seq=5)
        with c.pipeline() as p:
            p.call("append", seq=6, keys=keys).call("truncate", seq=6, length=1)
            assert p.execute() == [{"first": 0, "length": 100}, {"length": 1}]
    with pytest.raises(AttributeError):
        fp4idx.Client(d.socket).no_such_op


def test_tensors_go_and_come_back_as_arrays(make_daemon):
    d = make_daemon(cache_bytes="16M")
    packed = np.zeros((5, 68), np.uint8)
    packed[:, 64:] = 127  # scale bytes 1..254
    with fp4idx.Client(d.socket, timeout=30) as c:
        assert c.call("append", seq=1, keys=packed) == {"first": 0, "length": 5}
        assert c.call("append", seq=1, keys=np.ones((2, 128))) == {"first": 5, "length": 7}
        r = c.call("read", seq=1, count=5)
        assert isinstance(r["keys"], np.ndarray)
        assert np.array_equal(r["keys"], packed)
        assert np.array_equal(c.call("read", seq=1, from_=5)["keys"], c.read(1, 5))
        with pytest.raises(fp4idx.InvalidArgument, match="none of"):
            c.call("append", seq=1, keys=np.zeros((1, 128), np.int64))
