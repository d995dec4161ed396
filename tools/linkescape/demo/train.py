"""The demo's training job: DDP over the ``linkescape`` backend, on CPU.

Run by torchrun (one rank per testbed host) or as plain processes with the
torchrun environment (emulated mode)::

    torchrun ... -m linkescape.demo.train --out DIR --steps 200

Everything is deterministic: the model's initial weights, the synthetic data
(a fixed random "teacher" network labels Gaussian inputs; each rank draws its
own stream from the seed) and the reduction order of every all_reduce. Two
runs with the same arguments therefore produce bit-identical losses and
parameters, whatever happens to the network in between; that is what the
demo checks.

Rank 0 writes, under ``--out``:

* ``steps.jsonl``: one line per step, written as soon as the step ends:
  ``step``, ``loss`` (the mean over ranks), ``loss_hex`` (its exact bits),
  ``t`` (wall time at the end of the step), ``dt`` (seconds);
* ``params.npz``: the final parameters; ``final.json``: their SHA-256, the
  number of steps, whether every rank holds the same parameters.

Every rank writes ``routes-rank{R}.json`` at the end: per peer the rails that
carry its traffic and the rank it is relayed through (``via``, None when
direct), from ``Communicator.snapshot()``: where the traffic is once the
faults are over.

Any rank that fails writes ``error-rank{R}.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

from ..common import jsonl
from .model import DEFAULT_SIZE, MODEL_SIZES, SyntheticData, build_model, param_digest


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="linkescape.demo.train", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (rank 0 writes here)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default=DEFAULT_SIZE)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--control", default=None, help="directory of emulated fault commands (emulated mode)")
    p.add_argument("--rail-bytes", default=None,
                   help="write bytes sent per rail to this path ({rank} expanded), for rails without a NIC")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--min-duration", type=float, default=0.0,
                   help="pace the steps so training lasts at least this long (seconds); numerics unchanged")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # deterministic kernels, and 4 ranks share few cores
    torch.use_deterministic_algorithms(True)
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(args.out, exist_ok=True)
    agent = sampler = None
    try:
        dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=args.timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.control:
            from .emulated import FaultAgent

            agent = FaultAgent(args.control, rank).start()
        if args.rail_bytes:
            from .emulated import RailByteSampler

            sampler = RailByteSampler(args.rail_bytes.replace("{rank}", str(rank))).start()
        model = DDP(build_model(args.model_size, args.seed))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        data = SyntheticData(args.model_size, args.seed, rank)
        nparams = sum(p.numel() for p in model.parameters())
        fd = None
        dist.barrier()
        t_start = time.time()
        if rank == 0:
            fd = os.open(os.path.join(args.out, "steps.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                         0o644)
            jsonl.write(fd, {"start": t_start, "world_size": world, "params": nparams, "pid": os.getpid(),
                             "model_size": args.model_size, "steps": args.steps, "seed": args.seed,
                             "min_duration": args.min_duration}, compact=True)
        paused = _train(args, model, opt, data, world, fd, t_start)
        agree = _finish(args, model, world, rank, nparams, paused, fd)
        _write_routes(args.out, rank)
        if agent is not None:
            agent.stop()
        if sampler is not None:
            sampler.stop()
        dist.destroy_process_group()
        return 0 if agree else 3
    except BaseException:
        with open(os.path.join(args.out, f"error-rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        traceback.print_exc()
        sys.stdout.flush()
        return 1


def _train(args, model, opt, data, world: int, fd, t_start: float) -> float:
    """``args.steps`` steps; rank 0 (``fd``) writes each as it ends. Returns the seconds paused for pacing."""
    import torch
    import torch.distributed as dist

    t_prev = t_start
    paused = 0.0
    for step in range(args.steps):
        x, y = data.next()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # DDP all_reduces the gradient buckets here
        opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean)
        mean /= world
        if fd is not None:
            now = time.time()
            v = float(mean.item())
            jsonl.write(fd, {"step": step, "loss": v, "loss_hex": v.hex(), "t": now, "dt": now - t_prev},
                        compact=True)
            t_prev = now
            if args.min_duration > 0:  # the others wait for rank 0 in the next step's collectives
                target = t_start + args.min_duration * (step + 1) / args.steps
                if target > now:
                    time.sleep(target - now)
                    paused += target - now
                    t_prev = time.time()  # dt: the step itself, not the pause
    return paused


def _finish(args, model, world: int, rank: int, nparams: int, paused: float, fd) -> bool:
    """Do all ranks hold the same parameters? Rank 0 writes them and ``final.json``."""
    import numpy as np
    import torch
    import torch.distributed as dist

    digest, arrays = param_digest(model.module)
    mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    agree = all(torch.equal(mine, o) for o in everyone)
    if rank == 0:
        np.savez(os.path.join(args.out, "params.npz"), **arrays)
        final = {"steps_completed": args.steps, "params_sha256": digest, "ranks_agree": agree,
                 "world_size": world, "params": nparams, "end": time.time(),
                 "paused_s": round(paused, 3)}
        tmp = os.path.join(args.out, "final.json.tmp")
        with open(tmp, "w") as f:
            json.dump(final, f, indent=2)
        os.replace(tmp, os.path.join(args.out, "final.json"))
        os.close(fd)
    return agree


def _write_routes(out: str, rank: int) -> None:
    """Where this rank's traffic to each peer goes now (rails, relay), for the report."""
    try:
        from ..torch import get_communicator

        snap = get_communicator().snapshot()
    except Exception as exc:  # noqa: BLE001 - the report says it is missing
        snap = {"error": f"{type(exc).__name__}: {exc}", "peers": {}}
    routes = {"rank": rank, "error": snap.get("error"),
              "relayed_pairs": snap.get("relayed_pairs"), "relay_bytes": snap.get("relay_bytes"),
              "peers": {str(p): {"primary": v.get("primary"), "active": v.get("active"), "via": v.get("via")}
                        for p, v in (snap.get("peers") or {}).items()}}
    tmp = os.path.join(out, f"routes-rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(routes, f, indent=1, default=str)
    os.replace(tmp, os.path.join(out, f"routes-rank{rank}.json"))


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process group is closed: skip the
    # interpreter's teardown of torch, which takes seconds when four ranks
    # exit at once on a small machine.
    os._exit(status)
