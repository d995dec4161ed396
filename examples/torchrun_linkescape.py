"""torch.distributed over linkescape, launched by torchrun, without importing
linkescape: the ``torch.backends`` entry point registers the backend when
torch is imported.

    torchrun --nproc-per-node 2 examples/torchrun_linkescape.py [--no-destroy]

Rails: LINKESCAPE_RAILS=127.0.0.1,127.0.0.2 uses two loopback "rails";
by default the interface that reaches MASTER_ADDR is used.
"""

import argparse
import datetime

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-destroy", action="store_true", help="exit without destroy_process_group()")
    ap.add_argument("--leave-pending", action="store_true", help="exit with an unmatched irecv in flight")
    args = ap.parse_args()

    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "linkescape", dist.get_backend()

    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world * (world + 1) / 2), t[:4]

    b = torch.full((8,), float(rank), dtype=torch.bfloat16)
    dist.broadcast(b, src=world - 1)
    assert torch.all(b == world - 1)

    parts = [torch.empty(3, dtype=torch.float16) for _ in range(world)]
    dist.all_gather(parts, torch.full((3,), float(rank), dtype=torch.float16))
    assert [int(p[0]) for p in parts] == list(range(world))

    work = dist.all_reduce(torch.ones(4), async_op=True)  # completed but never waited for
    dist.barrier()
    if args.leave_pending and rank == 0:
        dist.irecv(torch.empty(4), src=1, tag=99)  # nobody sends: still pending at exit
    comm = getattr(dist.group.WORLD, "communicator", None)  # the linkescape Communicator
    print(f"rank {rank}/{world}: ok rails={getattr(comm, 'rail_addrs', None)}", flush=True)
    if not args.no_destroy:
        dist.destroy_process_group()
    del work


if __name__ == "__main__":
    main()
