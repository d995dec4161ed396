"""DDP with sparse gradients (``nn.EmbeddingBag(sparse=True)``) over
linkescape against the same training over Gloo in the same processes:
bit-identical parameters at 2 ranks (sparse all_reduce gathers indices and
values and coalesces, as Gloo does), allclose at 3."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

STEPS = 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.emb = nn.EmbeddingBag(50, 8, mode="sum", sparse=True)
        self.head = nn.Linear(8, 2)

    def forward(self, idx, offsets):
        return self.head(self.emb(idx, offsets))


def _train(group, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(Model(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(300 + rank)
    for _ in range(STEPS):
        idx = torch.randint(0, 50, (24,), generator=gen)  # repeats: uncoalesced sparse gradients
        offsets = torch.arange(0, 24, 4)
        y = torch.randn(6, 2, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(idx, offsets), y).backward()
        assert model.module.emb.weight.grad.is_sparse
        opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


def main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    le = _train(None, r)
    gl = _train(gloo, r)
    worst = 0.0
    for a, b in zip(le, gl):
        worst = max(worst, (a - b).abs().max().item())
        if n == 2:
            assert torch.equal(a, b), f"rank {r}: linkescape and gloo differ by {(a - b).abs().max().item()}"
        else:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"rank {r}: differ by {(a - b).abs().max()}"
    flat = torch.cat([p.reshape(-1) for p in le])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(e, flat) for e in everyone), "ranks disagree on the parameters"
    dist.destroy_process_group()
    print(f"rank {r}: ok max|linkescape-gloo|={worst:.3g}", flush=True)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ddp_sparse_embeddings_match_gloo(nprocs):
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], nprocs, timeout=150)


if __name__ == "__main__":
    main()
