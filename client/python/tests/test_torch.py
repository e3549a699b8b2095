"""torch inputs and outputs (skipped where torch is not installed; the CUDA
case also needs a GPU)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp4idx  # noqa: E402


def devices():
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    return out


@pytest.mark.parametrize("device", devices())
def test_torch_in_torch_out(device, client, seq):
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(130, 128, generator=g)
    q = torch.randn(3, 8, 128, generator=g)
    w = torch.rand(3, 8, generator=g)
    s1, s2 = seq(), seq()
    client.append(s1, keys.to(device))                       # f32
    client.append(s2, keys.to(device, torch.bfloat16))       # bf16
    ref = client.score(s1, q.numpy(), w.numpy())
    out = client.score(s1, q.to(device), w.to(device))
    assert isinstance(out, torch.Tensor) and out.device.type == device
    assert out.dtype == torch.float32
    assert np.array_equal(out.cpu().numpy(), ref)
    qb, wb = q.to(device, torch.bfloat16), w.to(device, torch.bfloat16)
    out_b = client.score(s2, qb, wb)
    # torch's float32 -> bf16 cast is RNE: the same bits the client makes.
    assert np.array_equal(qb.cpu().view(torch.int16).numpy().view(np.uint16),
                          fp4idx.bf16_bits(q.numpy()))
    assert np.array_equal(out_b.cpu().numpy(),
                          client.score(s2, fp4idx.bf16_bits(q.numpy()), fp4idx.bf16_bits(w.numpy())))
    pos, val, cnt = client.topk(s1, q.to(device), w.to(device), 4)
    assert all(isinstance(t, torch.Tensor) and t.device.type == device for t in (pos, val, cnt))
    assert pos.dtype == torch.int32 and cnt.dtype == torch.int32
    s3 = seq()
    client.append(s3, fp4idx.bf16_bits(keys.numpy()))   # the same bf16 keys from numpy
    assert np.array_equal(client.read(s2), client.read(s3))
