"""A training job that survives the loss of a rank with ``torchrun
--max-restarts``: the elastic agent restarts every worker, each one
re-creates its linkescape process group (in a fresh store namespace), loads
the last checkpoint and goes on from there.

    torchrun --nproc-per-node 2 --max-restarts 1 examples/elastic_checkpoint.py \\
        --ckpt /tmp/ckpt --steps 8 --kill-at 5

``--kill-at S``: in the first attempt only, the last rank SIGKILLs itself at
step S (a crash, not an exit). The run ends with the same parameters as an
uninterrupted one: the data of a step depends only on the step and the rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (shared by the ranks)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--kill-at", type=int, default=-1, help="the last rank dies at this step, first attempt only")
    ap.add_argument("--backend", default="linkescape", help="or gloo, to compare")
    args = ap.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == args.backend
    model = DDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = os.path.join(args.ckpt, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    print(f"rank {rank}: attempt {attempt} starts at step {start}", flush=True)

    for step in range(start, args.steps):
        if attempt == 0 and step == args.kill_at and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 2, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        dist.barrier()  # every rank finished the step: it may be checkpointed
        if rank == 0:
            tmp = path + ".tmp"
            torch.save({"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()}, tmp)
            os.replace(tmp, path)  # a crash never leaves half a checkpoint
        dist.barrier()

    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.ckpt, "final.pt"))
    print(f"rank {rank}: done at step {args.steps} after {attempt} restart(s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
