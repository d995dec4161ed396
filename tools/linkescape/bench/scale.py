"""``linkescape bench --scale 2,8,16,32``: what one rank costs as the job grows.

For each N, N rank processes start on this machine (two loopback rails,
127.0.0.1 and 127.0.0.2, one TCPStore). Each holds a Gloo process group and a
linkescape ``Communicator`` over the same store, and measures both side by
side in the same processes:

- ``init_s``: from a common start (a store barrier) until the group is ready,
  the slowest rank;
- ``init_cpu_ms``: CPU milliseconds the process spent in that init (all its
  threads: ``time.process_time``), the median rank. On a host with fewer cores
  than ranks, init's wall time is about N / cores times this;
- ``group_s``: from a common start until ``dist.new_group(backend=...)`` returned
  (the slowest rank): a torch group of each backend, what ``init_process_group``
  builds (torch's side and the backend's constructor), made once the rest is
  measured, Gloo's first (linkescape's opens its links after it returns);
- ``links_s``: from the same start until every link of every rank is up (the
  slowest rank): linkescape opens some of them after init returns (the
  backups; from 16 ranks on, all but the ring neighbours'), so this is what a
  job waits at most before every pair has its pre-created backup. Gloo's
  links are all up when its init returns. The idle window starts after it;
- ``idle_cpu``: CPU seconds per second of a rank while nothing is called, over
  ``--idle`` seconds. linkescape's share is the CPU of its own threads (read
  from ``/proc/self/task``); Gloo's is the rest of the process less the
  sleeping main thread, so both come from the same seconds;
- ``store_calls_per_s``: store calls of the backend while idle (each backend
  gets its own counting wrapper around the store; the wrapper passes
  ``multi_get`` on, one call, as the TCPStore under it answers it: torch's
  default for a store written in Python is a ``get`` per key);
- ``fds``: descriptors the backend opened, per rank;
- ``allreduce_4B_us`` and ``allreduce_1MiB_us``: the slowest rank's mean time of
  a loop of all_reduce calls, backends alternating which goes first in each
  round; the median of the rounds. Python's first full garbage collection
  after the imports (torch's objects: 80 ms per process, measured) is run
  before the timed rounds, as timing tools do: left to chance, it fell into
  the round of whichever backend happened to run then (at 2 ranks one 80 ms
  stall in 200 calls tripled that round's mean).
- ``allreduce_4B_isolated_us`` and ``allreduce_1MiB_isolated_us``: the isolated
  call, as the first gradient bucket of a step meets it: the backend's own
  barrier, then one timed call (``ISOLATED_CALLS`` of them per round, after
  each round's loop, backends alternating as in the loop); per call the
  slowest rank, then the median over every call of every round. In the loop
  the ranks drift apart and overlap one call with the next; here every rank
  arrives at once;
- ``..._cpu_us``, ``..._vcsw``, ``..._ivcsw`` (after ``allreduce_4B``,
  ``allreduce_4B_isolated``, ``allreduce_1MiB``, ``allreduce_1MiB_isolated``):
  per call and per rank (the median rank), the CPU microseconds, voluntary and
  involuntary context switches of the rank process (getrusage RUSAGE_SELF,
  every thread: see ``usage.py``), over the timed calls only (not the
  barriers); in the JSON also ``..._caller_cpu_us``, ``..._caller_vcsw``,
  ``..._caller_ivcsw``: the calling thread's share (RUSAGE_THREAD).

Rows go to stdout as a table and, with ``--json``, as JSON Lines.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from ..common import jsonl
from . import usage

PREFIX = "@@scale "
RAILS = ["127.0.0.1", "127.0.0.2"]
BACKENDS = ("linkescape", "gloo")
#: isolated calls per round at 4 B and at 1 MiB (each after a barrier of its backend)
ISOLATED_CALLS = (50, 10)


# ====================================================================== rank side
def _thread_cpu(tid: int) -> float:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def linkescape_cpu() -> float:
    """CPU seconds of every live linkescape thread of this process."""
    return sum(_thread_cpu(t.native_id) for t in threading.enumerate()
               if t.name.startswith("linkescape") and t.native_id is not None)


def wait_links_up(comm, t0: float, limit: float = 120.0) -> float:
    """Seconds from ``t0`` until every link of ``comm`` is up (``limit`` at most)."""
    while True:
        peers = comm.snapshot()["peers"].values()
        if all(l["usable"] for p in peers for l in p["links"]) or time.perf_counter() - t0 > limit:
            return time.perf_counter() - t0
        time.sleep(0.05)


def count_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def counting_store(store):
    """A torch Store that counts the calls made through it (``.calls``)."""
    import torch.distributed as dist

    class Counting(dist.Store):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner
            self.calls = 0

        def set(self, key, value):
            self.calls += 1
            return self.inner.set(key, value)

        def get(self, key):
            self.calls += 1
            return self.inner.get(key)

        def add(self, key, value):
            self.calls += 1
            return self.inner.add(key, value)

        def check(self, keys):
            self.calls += 1
            return self.inner.check(keys)

        def multi_get(self, keys):  # one round trip on a TCPStore (torch's default here: a get per key)
            self.calls += 1
            return self.inner.multi_get(keys)

        def multi_set(self, keys, values):
            self.calls += 1
            return self.inner.multi_set(keys, values)

        def wait(self, keys, timeout=None):
            self.calls += 1
            return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

        def compare_set(self, key, expected, desired):
            self.calls += 1
            return self.inner.compare_set(key, expected, desired)

        def delete_key(self, key):
            self.calls += 1
            return self.inner.delete_key(key)

        def num_keys(self):
            self.calls += 1
            return self.inner.num_keys()

    return Counting(store)


class ScaleRank:
    def __init__(self, rank: int, n: int, store, idle: float, rounds: int, emit: Callable[[dict], None]) -> None:
        self.rank, self.n, self.store, self.idle, self.rounds, self.emit = rank, n, store, idle, rounds, emit
        self._barriers = 0

    def barrier(self) -> None:
        """A barrier through the store (no backend involved)."""
        self._barriers += 1
        key = f"scale/barrier/{self._barriers}"
        self.store.add(key, 1)
        while int(self.store.add(key, 0)) < self.n:
            time.sleep(0.002)

    def publish(self, what: str, value) -> Optional[List]:
        """Every rank's ``value``, on rank 0 (None elsewhere)."""
        self.store.set(f"scale/{what}/{self.rank}", json.dumps(value))
        if self.rank:
            return None
        return [json.loads(self.store.get(f"scale/{what}/{r}")) for r in range(self.n)]

    def run(self) -> None:
        import numpy as np
        import torch
        import torch.distributed as dist

        from .. import Communicator

        np.seterr(all="ignore")
        n, rank = self.n, self.rank
        gstore, lstore = counting_store(self.store), counting_store(self.store)
        self.barrier()
        fd0 = count_fds()
        t0, c0 = time.perf_counter(), time.process_time()
        dist.init_process_group("gloo", store=dist.PrefixStore("scale/gloo", gstore), rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=600))
        init_gloo, cpu_gloo = time.perf_counter() - t0, time.process_time() - c0
        fd1 = count_fds()
        self.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        comm = Communicator(dist.PrefixStore("scale/le", lstore), rank, n, rails=RAILS)
        init_le, cpu_le_init = time.perf_counter() - t0, time.process_time() - c0
        links_le = wait_links_up(comm, t0)
        fd2 = count_fds()
        self.barrier()
        time.sleep(0.5)  # let start-up settle (the first beacon, threads ending)
        calls0 = (lstore.calls, gstore.calls)
        cpu_le0, cpu_all0, main0 = linkescape_cpu(), time.process_time(), time.thread_time()
        w0 = time.perf_counter()
        time.sleep(self.idle)
        wall = time.perf_counter() - w0
        cpu_le = linkescape_cpu() - cpu_le0
        cpu_all = time.process_time() - cpu_all0 - (time.thread_time() - main0)
        calls = (lstore.calls - calls0[0], gstore.calls - calls0[1])
        self.barrier()
        results = {"init": {"linkescape": init_le, "gloo": init_gloo},
                   "init_cpu": {"linkescape": cpu_le_init, "gloo": cpu_gloo},
                   "links": {"linkescape": links_le, "gloo": init_gloo},
                   "fds": {"linkescape": fd2 - fd1, "gloo": fd1 - fd0},
                   "idle_cpu": {"linkescape": cpu_le / wall, "gloo": max(0.0, cpu_all - cpu_le) / wall},
                   "store_calls_per_s": {"linkescape": calls[0] / wall, "gloo": calls[1] / wall},
                   "times": {}}
        gc.collect()  # the imports' full collection, before any timed round (see the module doc)
        results["usage"], results["isolated"], results["isolated_usage"] = {}, {}, {}
        barrier_by = {"linkescape": comm.barrier, "gloo": dist.barrier}
        for size, iters, alone in ((4, 200, ISOLATED_CALLS[0]), (1 << 20, 20, ISOLATED_CALLS[1])):
            buf = np.ones(size // 4, np.float32)
            tbuf = torch.from_numpy(buf.copy())
            calls_by = {"linkescape": lambda: comm.all_reduce(buf),
                        "gloo": lambda: dist.all_reduce(tbuf)}
            for name in BACKENDS:  # warm-up
                for _ in range(5):
                    calls_by[name]()
            per = {name: [] for name in BACKENDS}
            use = {name: {} for name in BACKENDS}
            one = {name: [] for name in BACKENDS}
            one_use = {name: {} for name in BACKENDS}
            for r in range(self.rounds):
                order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
                for name in order:  # the loop: calls back to back
                    self.barrier()
                    call = calls_by[name]
                    u0 = usage.now()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        call()
                    per[name].append((time.perf_counter() - t0) / iters * 1e6)
                    usage.add(use[name], u0, usage.now())
                for name in order:  # the isolated call: the backend's barrier, then one timed call
                    self.barrier()
                    call, bar, clock, now = calls_by[name], barrier_by[name], time.perf_counter, usage.now
                    for _ in range(alone):
                        bar()
                        u0 = now()
                        t0 = clock()
                        call()
                        t1 = clock()
                        usage.add(one_use[name], u0, now())
                        one[name].append((t1 - t0) * 1e6)
            results["times"][str(size)] = per
            results["usage"][str(size)] = {b: {k: v / (iters * self.rounds) for k, v in use[b].items()}
                                           for b in BACKENDS}
            results["isolated"][str(size)] = one
            results["isolated_usage"][str(size)] = {b: {k: v / (alone * self.rounds) for k, v in one_use[b].items()}
                                                    for b in BACKENDS}
        # A torch group of each backend (what init_process_group builds: torch's side, the backend's
        # constructor), Gloo's first: linkescape's opens its links after it returns, in the background.
        from ..torch.backend import _autoload

        _autoload()  # what torch's autoload does at `import torch` (the ranks start with it off)
        results["group"] = {}
        groups = []  # (held until destroy_process_group below closes them)
        for name in BACKENDS[::-1]:
            self.barrier()
            t0 = time.perf_counter()
            groups.append(dist.new_group(backend=name, timeout=datetime.timedelta(seconds=600)))
            results["group"][name] = time.perf_counter() - t0
        gathered = self.publish("results", results)
        self.barrier()
        comm.close()
        dist.destroy_process_group()
        if gathered is not None:
            self.emit({"event": "result", "n": n, "ranks": gathered})


def rank_main(argv: Optional[List[str]] = None) -> int:
    import argparse

    import torch.distributed as dist

    ap = argparse.ArgumentParser(prog="python -m linkescape.bench.scale")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    def emit(ev: dict) -> None:
        jsonl.emit(ev, PREFIX)

    store = dist.TCPStore("127.0.0.1", args.port, args.world_size, args.rank == 0,
                          timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
    if args.rank == 0:
        emit({"event": "store", "port": store.port})
    ScaleRank(args.rank, args.world_size, store, args.idle, args.rounds, emit).run()
    return 0


# ====================================================================== launcher side
def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_one(n: int, idle: float = 5.0, rounds: int = 3, timeout: float = 900.0) -> dict:
    """Start ``n`` ranks, wait for them, return one row (medians over ranks
    for per-rank costs, the slowest rank for times)."""
    base = [sys.executable, "-m", "linkescape.bench.scale", "--world-size", str(n), "--idle", str(idle),
            "--rounds", str(rounds)]
    import tempfile

    errs = tempfile.TemporaryFile(mode="w+")
    procs = [subprocess.Popen(base + ["--rank", "0", "--port", "0"], stdout=subprocess.PIPE, env=_env(),
                              stderr=errs, text=True)]
    result = None
    deadline = time.monotonic() + timeout
    try:
        for line in procs[0].stdout:
            ev = jsonl.parse(line[len(PREFIX):]) if line.startswith(PREFIX) else None
            if ev is None:
                continue
            if ev["event"] == "store":
                for r in range(1, n):
                    procs.append(subprocess.Popen(base + ["--rank", str(r), "--port", str(ev["port"])],
                                                  stdout=subprocess.DEVNULL, stderr=errs, env=_env()))
            elif ev["event"] == "result":
                result = ev
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {n}-rank run took longer than {timeout:g}s")
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if result is None or bad:
        errs.seek(0)
        text = errs.read()
        # the first rank's failure is the cause; the others follow from it
        first = text.find("Traceback")
        tail = text[first:first + 4000] if first >= 0 else text[-3000:]
        raise RuntimeError(f"the {n}-rank run failed (ranks {bad} exited non-zero):\n{tail}")
    errs.close()
    return summarize(n, result["ranks"])


def summarize(n: int, ranks: List[dict]) -> dict:
    row = {"world_size": n}
    for b in BACKENDS:
        rec = {"init_s": max(r["init"][b] for r in ranks),
               "group_s": max(r["group"][b] for r in ranks),
               "init_cpu_ms": statistics.median(r["init_cpu"][b] for r in ranks) * 1e3,
               "links_s": max(r["links"][b] for r in ranks),
               "idle_cpu_per_rank": statistics.median(r["idle_cpu"][b] for r in ranks),
               "store_calls_per_s_per_rank": statistics.median(r["store_calls_per_s"][b] for r in ranks),
               "fds_per_rank": statistics.median(r["fds"][b] for r in ranks)}
        for size, key in (("4", "allreduce_4B"), (str(1 << 20), "allreduce_1MiB")):
            rounds = len(ranks[0]["times"][size][b])
            worst = [max(r["times"][size][b][i] for r in ranks) for i in range(rounds)]
            rec[key + "_us"] = statistics.median(worst)
            calls = len(ranks[0]["isolated"][size][b])
            worst = [max(r["isolated"][size][b][i] for r in ranks) for i in range(calls)]
            rec[key + "_isolated_us"] = statistics.median(worst)
            for mode, field in (("", "usage"), ("_isolated", "isolated_usage")):
                for k in (k for k in usage.KEYS if k in ranks[0][field][size][b]):  # per call, the median rank
                    rec[f"{key}{mode}_{k}"] = statistics.median(r[field][size][b][k] for r in ranks)
        row[b] = rec
    return row


COLUMNS = (("idle_cpu_per_rank", "idle CPU/rank", "{:.4f}"), ("allreduce_4B_us", "4 B us", "{:.0f}"),
           ("allreduce_4B_isolated_us", "4 B isolated us", "{:.0f}"),
           ("allreduce_4B_isolated_cpu_us", "4 B isolated CPU us/call/rank", "{:.0f}"),
           ("allreduce_4B_isolated_vcsw", "4 B isolated vol. cs/call/rank", "{:.1f}"),
           ("allreduce_4B_isolated_ivcsw", "4 B isolated invol. cs/call/rank", "{:.1f}"),
           ("allreduce_4B_cpu_us", "4 B loop CPU us/call/rank", "{:.0f}"),
           ("allreduce_1MiB_us", "1 MiB us", "{:.0f}"), ("allreduce_1MiB_isolated_us", "1 MiB isolated us", "{:.0f}"),
           ("allreduce_1MiB_isolated_cpu_us", "1 MiB isolated CPU us/call/rank", "{:.0f}"),
           ("allreduce_1MiB_isolated_vcsw", "1 MiB isolated vol. cs/call/rank", "{:.1f}"),
           ("allreduce_1MiB_isolated_ivcsw", "1 MiB isolated invol. cs/call/rank", "{:.1f}"),
           ("allreduce_1MiB_cpu_us", "1 MiB loop CPU us/call/rank", "{:.0f}"),
           ("init_s", "init s", "{:.2f}"),
           ("group_s", "torch group s", "{:.2f}"),
           ("init_cpu_ms", "init CPU ms/rank", "{:.1f}"), ("links_s", "all links up s", "{:.2f}"),
           ("store_calls_per_s_per_rank", "store/s/rank", "{:.2f}"), ("fds_per_rank", "fds/rank", "{:.0f}"))


def format_row(row: dict) -> str:
    le, gl = row["linkescape"], row["gloo"]
    cells = [f"{row['world_size']:>4}"]
    for key, _title, fmt in COLUMNS:
        cells.append(f"{fmt.format(le[key])} / {fmt.format(gl[key])}")
    for key in RATIOS:
        cells.append(f"{le[key] / gl[key]:.2f}x" if gl[key] > 0 else "-")
    return " | ".join(cells)


#: linkescape / gloo, after the columns: loop and isolated times
RATIOS = ("allreduce_4B_us", "allreduce_4B_isolated_us", "allreduce_1MiB_us", "allreduce_1MiB_isolated_us")


def header() -> str:
    return " | ".join(["   N"] + [f"{t} (linkescape / gloo)" for _k, t, _f in COLUMNS]
                      + ["4 B ratio", "4 B isolated ratio", "1 MiB ratio", "1 MiB isolated ratio"])


def run_scale(sizes: List[int], json_path: Optional[str], echo: Callable[[str], None] = print,
              idle: float = 5.0, rounds: int = 3) -> List[dict]:
    echo(f"# linkescape bench --scale {','.join(map(str, sizes))} (rails {','.join(RAILS)}, "
         f"{os.cpu_count()} CPUs, idle {idle:g}s, {rounds} rounds)")
    echo(header())
    rows = []
    if json_path:
        open(json_path, "w").close()  # a fresh file; each row is appended as its N ends
    for n in sizes:
        row = run_one(n, idle=idle, rounds=rounds)
        rows.append(row)
        echo(format_row(row))
        if json_path:
            jsonl.append(json_path, row)
    return rows


if __name__ == "__main__":  # pragma: no cover - started by run_one
    from .leave import leave

    leave(rank_main())  # (not the interpreter's finalization: see bench/leave.py)
