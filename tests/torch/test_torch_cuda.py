"""CUDA tensors through the linkescape backend (host staging, like Gloo).
Skipped unless torch sees a GPU; both ranks may share one device."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist


def main():
    r = int(os.environ["RANK"])
    dev = torch.device("cuda", r % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    # device_id binds the group to the GPU (torch asks the backend about splitting)
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=60), device_id=dev)
    n = dist.get_world_size()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.full((1000,), r + 1, dtype=dtype, device=dev)
        dist.all_reduce(t)
        assert t.device == dev and torch.all(t == n * (n + 1) // 2).item(), (dtype, t[:4])
        b = torch.full((7,), r, dtype=dtype, device=dev)
        dist.broadcast(b, src=n - 1)
        assert torch.all(b == n - 1).item()
        out = torch.empty(3 * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, torch.full((3,), r, dtype=dtype, device=dev))
        assert out.cpu().tolist() == [q for q in range(n) for _ in range(3)]
        rs = torch.empty(2, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(rs, torch.ones(2 * n, dtype=dtype, device=dev))
        assert torch.all(rs == n).item()
        a2a = torch.empty(n, dtype=dtype, device=dev)
        dist.all_to_all_single(a2a, torch.arange(n, device=dev).to(dtype) + 10 * r, [1] * n, [1] * n)
        assert a2a.cpu().tolist() == [10 * q + r for q in range(n)]
    # a non-contiguous CUDA view, and an async op read on another stream
    base = torch.zeros(4, 4, device=dev)
    view = base[:, 1]
    view.fill_(r + 1)
    w = dist.all_reduce(view, async_op=True)
    w.wait()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        total = base.sum()
    s.synchronize()
    assert total.item() == 4 * n * (n + 1) / 2
    # DDP with a CUDA model
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4).to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 8, device=dev)).sum().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(e, flat) for e in everyone)
    dist.destroy_process_group()
    print(f"rank {r}: ok", flush=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_staged_through_host():
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], 2, timeout=180)


if __name__ == "__main__":
    main()
