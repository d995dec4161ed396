"""How long ``configure`` takes for a new quorum: linkescape's torchft group against torchft's Gloo group.

``python -m linkescape.torchft.configure_time --ranks 2,4,8 --quorums 10`` starts the ranks as processes
(forked after ``import torch``) on loopback, configures every group for ``--quorums`` quorums in turn,
each followed by an all_reduce (the group works) and a barrier in the store (torchft's should_commit),
and prints per backend and world size the median and the worst, over the quorums, of the slowest rank's
``configure``. Then the last rank leaves (its group aborted, as a lost replica's) and the others
configure one more quorum without it: ``leave_ms``, the slowest survivor's ``configure`` (linkescape's
group shrinks the group it has: ``leave_how``). Both backends run in the same processes, one after
the other, on the same store.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from datetime import timedelta
from typing import Dict, List


def _rank(rank: int, world: int, port: int, quorums: int, out) -> None:
    import torch
    from torch.distributed import TCPStore
    from torchft.process_group import ProcessGroupGloo

    from . import ProcessGroupLinkescape

    store = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    times: Dict[str, List[float]] = {}
    for name, cls in (("gloo", ProcessGroupGloo), ("linkescape", ProcessGroupLinkescape)):
        pg = cls(timeout=timedelta(seconds=30))
        times[name] = []
        for q in range(quorums):
            t0 = time.perf_counter()
            pg.configure(f"127.0.0.1:{port}/{name}/{q}", str(rank), rank, world, q)
            times[name].append(time.perf_counter() - t0)
            t = torch.ones(1)
            pg.allreduce([t], torch.distributed.ReduceOp.SUM).wait()
            assert t.item() == world
            # every rank is done with the quorum before any configures the next, as torchft's
            # should_commit makes sure (configure aborts the previous group)
            key = f"done/{name}/{q}"
            store.add(key, 1)
            while int(store.add(key, 0)) < world:
                time.sleep(0.001)
        # the last rank leaves; a quorum of the others (same order, ranks 0..world-2)
        if rank == world - 1 or world < 3:
            pg.abort()
        else:
            t0 = time.perf_counter()
            pg.configure(f"127.0.0.1:{port}/{name}/leave", str(rank), rank, world - 1, quorums)
            times[name + "_leave"] = [time.perf_counter() - t0]
            t = torch.ones(1)
            pg.allreduce([t], torch.distributed.ReduceOp.SUM).wait()
            assert t.item() == world - 1
            times[name + "_how"] = getattr(pg, "last_configure", "built")
        pg.shutdown()
    out.put((rank, times))


def measure(world: int, quorums: int) -> Dict[str, Dict[str, float]]:
    import torch  # noqa: F401 - imported once, before the fork
    import torchft.process_group  # noqa: F401
    from torch.distributed import TCPStore

    from . import ProcessGroupLinkescape  # noqa: F401

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, store.port, quorums, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    out = {}
    for name in ("gloo", "linkescape"):
        slowest = [max(res[r][name][k] for r in range(world)) for k in range(quorums)]
        out[name] = {"median_ms": round(statistics.median(slowest) * 1e3, 1), "max_ms": round(max(slowest) * 1e3, 1)}
        stayed = [r for r in range(world) if name + "_leave" in res[r]]
        if stayed:
            out[name]["leave_ms"] = round(max(res[r][name + "_leave"][0] for r in stayed) * 1e3, 1)
            out[name]["leave_how"] = sorted({res[r][name + "_how"] for r in stayed})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="linkescape.torchft.configure_time", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--quorums", type=int, default=10)
    args = p.parse_args(argv)
    worlds = [int(x) for x in args.ranks.split(",")]
    if len(worlds) > 1:  # each world size from a fresh process: forking one that ran groups can deadlock
        import subprocess
        import sys

        for world in worlds:
            subprocess.run([sys.executable, "-m", "linkescape.torchft.configure_time", "--ranks", str(world),
                            "--quorums", str(args.quorums)], check=False)
        return 0
    print(json.dumps({"ranks": worlds[0], "quorums": args.quorums, **measure(worlds[0], args.quorums)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
