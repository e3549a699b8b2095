"""fp4idx: the Python client of fp4idxd (protocol/PROTOCOL.md).

    import fp4idx
    with fp4idx.Client() as c:
        c.append(7, keys)                        # float32 / bf16 [n,128]
        logits = c.score(7, q, w)                # float32 [R, W]
        pos, val, cnt = c.topk(7, q, w, 16)

Client (blocking, pipeline()), AsyncClient (asyncio), ShardedClient (several
daemons), zero-copy regions (Client.region, Client.register_cuda), channels
whose calls a CUDA stream or graph makes (Client.channel), and one exception
class per status code, all under fp4idx.Error.
"""
from .errors import *  # noqa: F401,F403  (the exception classes)
from .errors import Error, error_for
from .client import Client, Pipeline
from .aio import AsyncClient, AsyncPipeline
from .sharded import ShardedClient
from .arrays import bf16_bits
from .regions import Ref, Region
from .channel import Channel
from .wire import default_socket

__version__ = "0.1.0"

from . import errors as _errors

__all__ = ["Client", "Pipeline", "AsyncClient", "AsyncPipeline", "ShardedClient",
           "Region", "Ref", "Channel", "bf16_bits", "default_socket", *_errors.__all__]
