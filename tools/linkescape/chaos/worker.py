"""One rank of the chaos soak, run inside a testbed host.

``python -m linkescape.chaos.worker --rank R --world N --store DIR --seed S --ops FILE --stop-file F``

Runs the steps of :mod:`linkescape.chaos.workload` one after the other and
checks every result exactly. Writes:

* ``--ops FILE``: one JSON line per step, with one ``os.write`` on an
  ``O_APPEND`` descriptor (nothing is lost if the rank is killed):
  ``{"k", "kind", "ops": [[op, dtype, bytes], ...], "t0", "t1", "wrong", "waits"}``, wall
  times of the step's first call and of its last completion, and the ranks whose calls the
  step cannot complete without (``workload.waits_for``); a mismatch adds ``"bad"``. The
  all_reduce of the stop flag after every 4th step (below) has a record of its own, ``"kind":
  "stop"`` with that step's ``k``;
* stdout: JSON lines for the controller: ``ready``, ``resources`` (at start,
  warmed up, end and after ``close()``), ``progress`` every 0.5 s (steps done,
  elements wrong, the step outstanding and since when), ``mismatch`` for each
  wrong result, and ``exit`` (counts by operation, wrong, error);
* ``heap-RANK.jsonl`` beside ``--ops FILE``: every minute, the heap's account
  (``engine/heap.usage``: glibc's bytes in use, free inside the heaps, mapped
  on their own), Python's allocated blocks and RSS, to tell what keeps memory
  (a leak grows ``in_use``, fragmentation ``free``).

The ranks stop together: every 4th step is followed by a 4-byte all_reduce of
each rank's "the stop file exists" flag; all see the same sum after the same
step, so no rank starts a collective that another skips.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, Optional

import numpy as np

from ..common import jsonl
from ..common.jsonl import say
from . import workload

STOP_EVERY = 4
WARM_STEPS = 50


def resources() -> Dict[str, Any]:
    """Open file descriptors, OS threads and resident memory of this process."""
    out: Dict[str, Any] = {"fds": len(os.listdir("/proc/self/fd")), "py_threads": threading.active_count()}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    out["sockets"] = sockets
    return out


class Progress:
    """What the progress thread reports: shared with the loop, read without locks (a snapshot)."""

    def __init__(self) -> None:
        self.steps = 0
        self.verified = 0
        self.wrong = 0
        self.current: Optional[int] = None
        self.since: Optional[float] = None
        self.last_done: Optional[float] = None


#: seconds between two heap samples
HEAP_EVERY_S = 60.0


def heap_sample(steps: int) -> Dict[str, Any]:
    """One line of ``heap-RANK.jsonl``: glibc's heap account, Python's blocks, RSS."""
    from linkescape.engine import heap

    rec: Dict[str, Any] = {"t": round(time.time(), 3), "steps": steps, "py_blocks": sys.getallocatedblocks(),
                           "rss_mb": resources().get("rss_mb")}
    rec.update(heap.usage() or {})
    return rec


def _progress_loop(prog: Progress, stop: threading.Event, heap_fd: Optional[int] = None) -> None:
    next_heap = time.monotonic()
    while not stop.wait(0.5):
        say(event="progress", steps=prog.steps, verified=prog.verified, wrong=prog.wrong, step=prog.current,
                since=prog.since, last_done=prog.last_done)
        if heap_fd is not None and time.monotonic() >= next_heap:
            next_heap += HEAP_EVERY_S
            jsonl.write(heap_fd, heap_sample(prog.steps), compact=True)


def run(args: argparse.Namespace) -> int:
    import faulthandler
    import signal

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the controller asks before killing a hung rank

    from linkescape import Communicator, FileStore

    prog = Progress()
    counts: Dict[str, int] = {name: 0 for name in workload.OPERATIONS}
    error: Optional[Dict[str, Any]] = None
    stop_progress = threading.Event()
    ops_fd = os.open(args.ops, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    heap_fd = os.open(os.path.join(os.path.dirname(os.path.abspath(args.ops)), f"heap-{args.rank}.jsonl"),
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    say(event="resources", at="start", **resources())
    comm = None
    try:
        comm = Communicator(FileStore(args.store, timeout=120), args.rank, args.world)
        say(event="ready", rank=args.rank, rails=list(comm.rails))
        threading.Thread(target=_progress_loop, args=(prog, stop_progress, heap_fd), name="chaos-progress",
                         daemon=True).start()
        flag = np.zeros(1, np.int32)
        k = 0
        while True:
            step = workload.plan_step(args.seed, k, args.world, args.max_bytes)
            prog.current, prog.since = k, time.time()
            rec = _run_step(comm, args.seed, step, args.rank, args.world)
            jsonl.write(ops_fd, rec, compact=True)
            prog.steps += 1
            prog.wrong += rec["wrong"]
            prog.last_done = rec["t1"]
            prog.current = prog.since = None
            for op in step.ops:
                for name in workload.counts_as(op):
                    counts[name] += 1
            prog.verified = sum(counts.values())
            if k + 1 == WARM_STEPS:
                say(event="resources", at="warm", **resources())
            if k % STOP_EVERY == STOP_EVERY - 1:
                flag[0] = 1 if os.path.exists(args.stop_file) else 0
                t0 = prog.since = time.time()
                prog.current = k
                comm.all_reduce(flag)
                prog.current = prog.since = None
                # judged like any step (a stall here is the library's too): its own record, kind "stop"
                jsonl.write(ops_fd, {"k": k, "kind": "stop", "ops": [["all_reduce", "int32", 4]],
                                     "t0": round(t0, 6), "t1": round(time.time(), 6),
                                     "wrong": int(not 0 <= flag[0] <= args.world),
                                     "waits": [q for q in range(args.world) if q != args.rank]}, compact=True)
                if flag[0] > 0:
                    break
            k += 1
        comm.barrier()
        say(event="resources", at="end", **resources())
        comm.close()
        comm = None
        time.sleep(0.2)  # threads the close stopped are gone by now, or never will be
        left = [t.name for t in threading.enumerate() if t is not threading.current_thread()
                and not t.name.startswith("chaos-")]
        say(event="resources", at="closed", leftover_threads=left, **resources())
    except BaseException as exc:  # noqa: BLE001 - reported to the controller
        error = {"type": type(exc).__name__, "message": str(exc),
                 "attrs": {k: v for k, v in vars(exc).items() if not k.startswith("_")},
                 "traceback": traceback.format_exc()[-4000:], "step": prog.current, "t": time.time()}
        traceback.print_exc()
    finally:
        stop_progress.set()
        os.close(ops_fd)
    say(event="exit", rank=args.rank, counts=counts, steps=prog.steps, wrong=prog.wrong, error=error)
    sys.stdout.flush()
    if comm is not None:
        try:
            comm.abort()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0 if error is None and prog.wrong == 0 else 1)


def _run_step(comm, seed: int, step: workload.Step, rank: int, world: int) -> Dict[str, Any]:
    t0 = time.time()
    posted = []
    if step.kind == "op":
        works, buf = workload.post(comm, seed, step.k, step.ops[0], async_op=False)
        for w in works:
            w.wait()
        posted.append((step.ops[0], buf))
    else:
        pending = []
        for op in step.ops:
            works, buf = workload.post(comm, seed, step.k, op, async_op=step.kind != "barrier")
            pending.append(works)
            posted.append((op, buf))
        for works in pending:
            for w in works:
                w.wait()
    t1 = time.time()
    wrong = 0
    bad = []
    for op, buf in posted:
        res = workload.check(seed, step.k, op, rank, world, buf)
        if res["wrong"]:
            wrong += res["wrong"]
            bad.append({"op": op.kind, "dtype": op.dtype, "count": op.count, "root": op.root, "reduce": op.op,
                        "salt": op.salt, **res})
            say(event="mismatch", k=step.k, **bad[-1])
    rec: Dict[str, Any] = {"k": step.k, "kind": step.kind,
                           "ops": [[op.kind, op.dtype, op.nbytes(world)] for op in step.ops],
                           "t0": round(t0, 6), "t1": round(t1, 6), "wrong": wrong,
                           "waits": workload.waits_for(step, rank, world)}
    if bad:
        rec["bad"] = bad
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--ops", required=True, help="file for one JSON line per step")
    p.add_argument("--stop-file", required=True, help="the ranks stop together once this file exists")
    p.add_argument("--max-bytes", type=int, default=workload.MAX_BYTES)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
