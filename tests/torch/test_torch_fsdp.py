"""FSDP2 (``fully_shard``) training on CPU over linkescape, compared with the
same training over Gloo (a DeviceMesh made from a Gloo group)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

STEPS = 3


def _train(mesh, rank):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def main():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    le = _train(init_device_mesh("cpu", (n,)), r)
    gl = _train(DeviceMesh.from_group(gloo, "cpu"), r)
    for k in le:
        if n == 2:
            assert torch.equal(le[k], gl[k]), f"{k}: differs from gloo by {(le[k] - gl[k]).abs().max()}"
        else:
            assert torch.allclose(le[k], gl[k], rtol=1e-5, atol=1e-6), k
    dist.destroy_process_group()
    print(f"rank {r}: ok")


def test_fsdp2_matches_gloo():
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], 2, timeout=120)


if __name__ == "__main__":
    main()
