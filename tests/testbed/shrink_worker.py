"""One rank of tests/testbed/test_shrink_testbed.py, run inside a testbed host:
torch.distributed with the linkescape backend over the host's rails, a TCPStore on
host 0's management address. Every rank waits for the test to cut host 2 (the file
``DIR/cut``), then makes a collective; the survivors shrink the group after its error.
Prints one JSON line: what each call did and when (wall time)."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time


def main() -> None:
    rank, world, port, timeout_s, run_dir = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                              float(sys.argv[4]), sys.argv[5])
    store_host = sys.argv[6]
    cut_host = world - 1
    import torch
    import torch.distributed as dist

    store = dist.TCPStore(store_host, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group("linkescape", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == world
    print(json.dumps({"ready": rank}), flush=True)
    while not os.path.exists(os.path.join(run_dir, "cut")):
        time.sleep(0.01)
    out = {"rank": rank, "call_at": time.time()}
    try:
        dist.all_reduce(torch.ones(1 << 16))
        out["first"] = "result"
    except dist.DistBackendError as exc:
        cause = getattr(exc, "cause", None)
        out["first"] = type(cause).__name__
        out["first_peer"] = getattr(cause, "peer", None)
        out["first_peers"] = list(getattr(cause, "peers", ()) or ())
    out["first_at"] = time.time()
    if rank == cut_host:
        # cut off from every rail (and perhaps the store): a second call fails at once or after the deadline
        try:
            dist.all_reduce(torch.ones(8))
            out["second"] = "result"
        except dist.DistBackendError as exc:
            out["second"] = type(getattr(exc, "cause", None)).__name__
        out["second_at"] = time.time()
        print(json.dumps(out), flush=True)
        os._exit(0)  # (its store is gone in one of the runs: no teardown through it)
    t0 = time.time()
    try:
        dist.all_reduce(torch.ones(8))
        out["again"] = "result"
    except dist.DistBackendError as exc:
        out["again"] = type(getattr(exc, "cause", None)).__name__
        out["again_peer"] = getattr(getattr(exc, "cause", None), "peer", None)
    out["again_s"] = time.time() - t0
    if out["again"] == "LinkFailure" and world > 2:
        # no path to one rank: calls among the others go on (0 and 1, point to point)
        if rank == 0:
            dist.send(torch.arange(4.0), 1, tag=11)
            out["p2p"] = "sent"
        elif rank == 1:
            got = torch.empty(4)
            dist.recv(got, 0, tag=11)
            out["p2p"] = "ok" if got.tolist() == [0.0, 1.0, 2.0, 3.0] else "wrong"
    t0 = time.monotonic()
    dist.shrink_group([cut_host], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    out["shrink_s"] = time.monotonic() - t0
    out["new_rank"], out["new_size"] = dist.get_rank(), dist.get_world_size()
    n = world - 1
    big = torch.full((1 << 18,), float(dist.get_rank() + 1))
    dist.all_reduce(big)
    out["sum_ok"] = bool(torch.all(big == n * (n + 1) / 2))
    parts = [torch.empty(3) for _ in range(n)]
    dist.all_gather(parts, torch.full((3,), float(dist.get_rank())))
    out["gather_ok"] = [float(p[0]) for p in parts] == [float(q) for q in range(n)]
    dist.barrier()
    print(json.dumps(out), flush=True)
    time.sleep(1.0)  # (rank 0 holds the store: the others finish with it first)
    os._exit(0)


if __name__ == "__main__":
    main()
