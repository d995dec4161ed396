"""DistributedDataParallel over linkescape against DDP over Gloo.

Each rank trains the same small MLP (with a BatchNorm, so DDP also
broadcasts buffers every forward) for a few steps from the same seed and
data, once over linkescape (twice, to check determinism) and once over a
Gloo group in the same processes. With 2 ranks every sum is a + b, so the
parameters must be bit-identical; with more ranks the summation order
decides the last bits, so they are compared with a tolerance.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

STEPS = 5


def _model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _train(group, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), process_group=group, bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    params = [p.detach().clone() for p in model.module.parameters()]
    buffers = [b.detach().clone() for b in model.module.buffers()]
    return params + buffers, len(params)


def main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    le1, nparams = _train(None, r)
    le2, _ = _train(None, r)
    gl, _ = _train(gloo, r)
    for a, b in zip(le1, le2):
        assert torch.equal(a, b), "linkescape DDP is not deterministic"
    worst = 0.0
    for a, b in zip(le1, gl):
        if a.is_floating_point():
            worst = max(worst, (a - b).abs().max().item())
        if n == 2:
            assert torch.equal(a, b), f"rank {r}: linkescape and gloo differ by {(a - b).abs().max().item()}"
        else:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"rank {r}: differ by {(a - b).abs().max()}"
    # every rank holds the same parameters (buffers such as BatchNorm's
    # running stats are updated locally after DDP broadcast them)
    flat = torch.cat([p.reshape(-1).to(torch.float64) for p in le1[:nparams]])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    for other in everyone:
        assert torch.equal(other, flat), "ranks disagree on the parameters"
    dist.destroy_process_group()
    print(f"rank {r}: ok max|linkescape-gloo|={worst:.3g}")


@pytest.mark.parametrize("nprocs", [2, 4])
def test_ddp_matches_gloo(nprocs):
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], nprocs, timeout=150)


if __name__ == "__main__":
    main()
