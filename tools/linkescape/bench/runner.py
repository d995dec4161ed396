"""Ranks of a benchmark, and the launcher that starts them on this machine.

Each rank is a separate process (``python -m linkescape.bench.runner``) that
holds every backend at once (a linkescape Communicator and a gloo process
group) and, for each size, measures them one after the other, alternating
which goes first, so that both see the same noise.

One measurement, on every rank:

1. fresh buffers with known inputs; one run; count the wrong elements;
2. ``warmup`` untimed runs;
3. the backend's barrier, then ``iters`` runs back to back, timing each one
   (``time.perf_counter`` between consecutive completions); with
   ``spec.isolated``, each run alone after the backend's barrier (the first
   bucket of a step: every rank arrives at once); around the timed runs, the
   process's CPU time and context switches (``usage.py``);
4. every rank publishes its times in the store; rank 0 takes, per iteration,
   the slowest rank, and reports the median of that (mean, min and max too).

With ``spec.gated`` (Open MPI beside the ranks: ``mpi.MpiLauncher``) the ranks
wait for the launcher's turn before each (op, size) step (``Rank.gate``).

Events go from the ranks to the launcher as JSON lines on stdout, prefixed
with ``EVENT_PREFIX``. Every rank runs a watchdog: an operation that makes no
progress for ``timeout`` (+ a grace) seconds, or a launcher that went away,
ends the rank; the launcher then stops all ranks and fails with the rank's
message.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional

import numpy as np

from ..common import jsonl
from . import usage
from .spec import OPS, BenchSpec, busbw_factor

EVENT_PREFIX = "@@linkescape-bench "
KEY = "linkescape-bench/{what}/{seq}/{rank}"
WATCHDOG_GRACE = 15.0


class BenchError(RuntimeError):
    """The benchmark could not run or a rank failed (the CLI exits non-zero)."""


def child_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: keep gloo off other interfaces
    # The ranks use torch only for gloo and its store; do not load device
    # backend plugins (the linkescape torch backend included) on import.
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ====================================================================== rank side
class Watchdog(threading.Thread):
    """Ends the process when ``beat`` stops moving for ``limit`` seconds, or
    when the parent process is gone; says it is alive every ``alive_every``."""

    def __init__(self, limit: float, emit: Callable[[dict], None], rank: int, watch_parent: bool,
                 alive_every: float = 5.0) -> None:
        super().__init__(name="bench-watchdog", daemon=True)
        self.limit = limit
        self.emit = emit
        self.rank = rank
        self.beat = 0
        self.phase = "starting"
        self.alive_every = alive_every
        self.ppid = os.getppid() if watch_parent else None

    def run(self) -> None:
        last_beat, since = self.beat, time.monotonic()
        last_alive = since
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            if self.ppid is not None and os.getppid() != self.ppid:
                os._exit(4)  # the launcher is gone: nobody reads our results
            if self.beat != last_beat:
                last_beat, since = self.beat, now
            elif now - since > self.limit:
                msg = f"rank {self.rank}: no progress for {now - since:.0f}s during {self.phase}"
                try:
                    self.emit({"event": "error", "rank": self.rank, "message": msg, "kind": "timeout"})
                    print(f"linkescape bench: {msg}", file=sys.stderr, flush=True)
                finally:
                    os._exit(3)
            if now - last_alive >= self.alive_every:
                last_alive = now
                self.emit({"event": "alive", "rank": self.rank})


def open_store(kind: str, host: str, port: int, path: Optional[str], rank: int, world_size: int,
               timeout: float, is_master: Optional[bool] = None):
    if kind == "file":
        from ..common.store import FileStore

        return FileStore(path, timeout=timeout)
    import datetime

    import torch.distributed as dist

    master = (rank == 0) if is_master is None else is_master
    return dist.TCPStore(host, port, world_size, master, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False)


def _stats(times: List[float]) -> dict:
    us = [t * 1e6 for t in times]
    return {"time_us": statistics.median(us), "time_us_mean": statistics.fmean(us), "time_us_min": min(us),
            "time_us_max": max(us)}


def make_record(spec: BenchSpec, op: str, backend: str, case, per_rank: List[dict], rails: List[str],
                requested: int) -> dict:
    """Rank 0's record of one measurement from every rank's times."""
    n = spec.world_size
    iters = len(per_rank[0]["times"])
    worst = [max(r["times"][i] for r in per_rank) for i in range(iters)]
    rec = {"op": op, "backend": backend, "world_size": n, "size": case.nbytes, "count": case.count,
           "type": spec.dtype, "redop": spec.redop if OPS[op].reduces else None,
           "root": spec.root if OPS[op].rooted else None}
    rec.update(_stats(worst))
    t = rec["time_us"]
    factor = busbw_factor(op, n)
    rec["algbw"] = case.nbytes / t / 1e3 if t > 0 else 0.0  # bytes/us/1e3 = GB/s
    rec["busbw"] = rec["algbw"] * factor
    rec["busbw_factor"] = factor
    rec["wrong"] = sum(r["wrong"] for r in per_rank) if spec.check else None
    rec["checked"] = spec.check
    rec["iters"] = spec.iters
    rec["warmup"] = spec.warmup
    rec["rails"] = list(rails)
    rec["requested_size"] = requested
    rec["times_us"] = [round(x * 1e6, 3) for x in worst]
    # CPU time (user + system, all threads) per iteration: what a rank burns,
    # which decides the outcome when ranks share cores
    cpus = [r.get("cpu", 0.0) * 1e6 for r in per_rank]
    rec["cpu_us"] = statistics.fmean(cpus)
    rec["cpu_us_per_rank"] = [round(c, 1) for c in cpus]
    # context switches of the rank process per call, and the calling thread's share of all
    # (getrusage: see usage.py), the mean rank
    for key in ("vcsw", "ivcsw", "caller_cpu_us", "caller_vcsw", "caller_ivcsw"):
        if any(key not in r for r in per_rank):
            continue  # Open MPI's ranks read the process only
        per = [r[key] for r in per_rank]
        rec[key] = statistics.fmean(per)
        rec[f"{key}_per_rank"] = [round(x, 2) for x in per]
    rec["isolated"] = spec.isolated
    return rec


class Rank:
    def __init__(self, spec: BenchSpec, rank: int, store, emit: Callable[[dict], None], watchdog: Watchdog) -> None:
        self.spec = spec
        self.rank = rank
        self.n = spec.world_size
        self.store = store
        self.emit = emit
        self.wd = watchdog
        self.backends: List = []
        self.seq = 0

    def _phase(self, text: str) -> None:
        self.wd.phase = text
        self.wd.beat += 1

    def _get(self, key: str):
        value = self.store.get(key)
        self.wd.beat += 1
        return value

    def setup(self) -> None:
        from .backends import GlooBackend, LinkescapeBackend

        for name in self.spec.python_backends():  # Open MPI's ranks are mpirun's (mpi.py)
            self._phase(f"{name} start-up (rendezvous)")
            if name == "linkescape":
                self.backends.append(LinkescapeBackend(self.store, self.rank, self.n, self.spec.rails,
                                                       self.spec.timeout))
            elif name == "floor":
                from .floor import FloorBackend

                self.backends.append(FloorBackend(self.store, self.rank, self.n, self.spec.rails[0],
                                                  self.spec.timeout))
            else:
                self.backends.append(GlooBackend(self.store, self.rank, self.n, self.spec.timeout))
        self._phase("start-up")
        le = [b for b in self.backends if b.name == "linkescape"]
        self.rails = le[0].rails if le else list(self.spec.rails)
        info = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "rails": self.rails}
        self.store.set(KEY.format(what="hello", seq=0, rank=self.rank), json.dumps(info))
        if self.rank == 0:
            ranks = [json.loads(self._get(KEY.format(what="hello", seq=0, rank=r))) for r in range(self.n)]
            self.emit({"event": "ranks", "ranks": ranks})

    def measure(self, backend, op: str, size: int) -> dict:
        from .cases import Case

        spec = self.spec
        self._phase(f"{backend.name} {op} size {size}: buffers")
        case = Case(op, self.rank, self.n, size, spec.dtype, spec.redop, spec.root)
        call = backend.call(case)
        wrong = 0
        if spec.check:
            self._phase(f"{backend.name} {op} size {size}: checked run")
            call()
            wrong = case.check()
            case.settle()
        self._phase(f"{backend.name} {op} size {size}: warmup")
        for _ in range(spec.warmup):
            call()
            self.wd.beat += 1
        # Python's full garbage collections before the timed runs, as timing tools do: the first after
        # torch's import takes 80-150 ms, and left to chance it fell into a timed run (4 B all_reduce at
        # 4 ranks: around the 130th of every run, a 55-155 ms outlier in the mean)
        gc.collect()
        self._phase(f"{backend.name} {op} size {size}: barrier before the timed runs")
        backend.barrier()
        self._phase(f"{backend.name} {op} size {size}: timed runs")
        times = []
        wd = self.wd
        clock, now = time.perf_counter, usage.now
        if spec.isolated:  # each call after the backend's barrier, as every rank arrives at once
            spent: dict = {}
            barrier = backend.barrier
            for _ in range(spec.iters):
                barrier()
                u0 = now()
                t0 = clock()
                call()
                t1 = clock()
                usage.add(spent, u0, now())
                times.append(t1 - t0)
                wd.beat += 1
            used = {k: v / spec.iters for k, v in spent.items()}
        else:
            u0 = now()
            t0 = clock()
            for _ in range(spec.iters):
                call()
                t1 = clock()
                times.append(t1 - t0)
                t0 = t1
                wd.beat += 1
            used = usage.per_call(u0, now(), spec.iters)
        # every thread of this process, per call (and the calling thread's share)
        cpu = used["cpu_us"] / 1e6
        if op == "send_recv":
            times = [t / 2 for t in times]  # one way of the round trip
        self._phase(f"{backend.name} {op} size {size}: gathering results")
        self.seq += 1
        self.store.set(KEY.format(what="res", seq=self.seq, rank=self.rank), json.dumps({"times": times, "wrong": wrong,
                                                                                        "cpu": cpu, **used}))
        if self.rank != 0:
            return {}
        per_rank = [json.loads(self._get(KEY.format(what="res", seq=self.seq, rank=r))) for r in range(self.n)]
        return make_record(spec, op, backend.name, case, per_rank, self.rails, size)

    def gate(self, step: int) -> None:
        """Waits for the launcher's turn (``spec.gated``): rank 0 reads a line from its
        standard input and passes it on through the store; the others wait for that key."""
        key = KEY.format(what="gate", seq=step, rank=0)
        self._phase(f"waiting for the turn of step {step} (Open MPI measures meanwhile)")
        if self.rank == 0:
            import select

            while True:
                ready, _, _ = select.select([sys.stdin], [], [], 1.0)
                self.wd.beat += 1
                if ready:
                    break
            line = sys.stdin.readline().strip()
            if line != "go":
                raise BenchError(f"the launcher ended the run (said {line!r} before step {step})")
            self.store.set(key, b"go")
            return
        if hasattr(self.store, "wait"):
            import datetime

            import torch.distributed as dist

            while True:
                try:
                    self.store.wait([key], datetime.timedelta(seconds=2))
                    return
                except dist.DistStoreError:  # its timeout: still waiting
                    self.wd.beat += 1
                except RuntimeError as exc:  # the store's host (rank 0) is gone: nobody will say go
                    raise BenchError(f"the store is gone while waiting for the turn of step {step}: "
                                     f"{str(exc).splitlines()[0]}") from None
        while not self.store.check([key]):
            time.sleep(0.05)
            self.wd.beat += 1

    def run(self) -> None:
        spec = self.spec
        last_op, k = None, 0
        for step, (op, size) in enumerate(spec.steps()):
            k += 1
            if op != last_op:  # k: the size's place in the op's sizes (which backend goes first)
                last_op, k = op, 0
                if self.rank == 0:
                    self.emit({"event": "op", "op": op})
            if spec.gated:
                self.gate(step)
            order = self.backends if k % 2 == 0 else self.backends[::-1]
            row = {}
            for backend in order:
                rec = self.measure(backend, op, size)
                if rec:
                    row[backend.name] = rec
            if self.rank == 0:
                self.emit({"event": "row", "op": op, "step": step,
                           "records": [row[b] for b in spec.python_backends()]})
        self._phase("shutdown")
        for backend in self.backends:
            backend.barrier()
        self.close()
        self.finish()
        if self.rank == 0:
            self.emit({"event": "done"})

    def finish(self) -> None:
        """Rank 0 holds the TCP store: it leaves only once every rank said it is done, so that no
        rank still waits on a key (a gated run's last turn) when the store goes away."""
        if self.rank != 0:
            self.store.set(KEY.format(what="fin", seq=0, rank=self.rank), b"1")
            return
        for r in range(1, self.n):
            self._get(KEY.format(what="fin", seq=0, rank=r))

    def close(self, abort: bool = False) -> None:
        while self.backends:
            backend = self.backends.pop()
            try:
                backend.abort() if abort else backend.close()
            except Exception:  # noqa: BLE001 - closing after an error
                pass


def rank_main(argv: Optional[List[str]] = None) -> int:
    """Entry point of one rank started by the local launcher."""
    ap = argparse.ArgumentParser(prog="python -m linkescape.bench.runner")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--store", required=True, help="tcp:HOST:PORT or file:PATH")
    ap.add_argument("--spec", required=True, help="BenchSpec as JSON")
    args = ap.parse_args(argv)
    spec = BenchSpec.from_dict(json.loads(args.spec))

    def emit(event: dict) -> None:
        jsonl.emit(event, EVENT_PREFIX)

    wd = Watchdog(spec.timeout + WATCHDOG_GRACE, emit, args.rank, watch_parent=True)
    wd.start()
    return run_rank(spec, args.rank, args.store, emit, wd)


def run_rank(spec: BenchSpec, rank: int, store_arg: str, emit: Callable[[dict], None], wd: Watchdog) -> int:
    np.seterr(all="ignore")
    rank_obj = None
    try:
        kind, _, rest = store_arg.partition(":")
        if kind == "file":
            store = open_store("file", "", 0, rest, rank, spec.world_size, spec.timeout)
        else:
            host, _, port = rest.rpartition(":")
            store = open_store("tcp", host, int(port), None, rank, spec.world_size, spec.timeout)
            if rank == 0 and int(port) == 0:
                emit({"event": "store", "port": store.port})
        rank_obj = Rank(spec, rank, store, emit, wd)
        rank_obj.setup()
        rank_obj.run()
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit non-zero
        emit({"event": "error", "rank": rank, "message": f"{type(exc).__name__}: {exc}",
              "phase": wd.phase, "traceback": traceback.format_exc()})
        if rank_obj is not None:
            rank_obj.close(abort=True)
        return 1


# ====================================================================== launcher side
class LocalLauncher:
    """Starts ``spec.world_size`` rank processes on this machine and turns
    their events into calls of ``on_event``; stops every rank on any failure."""

    def __init__(self, spec: BenchSpec, on_event: Callable[[dict], None], verbose: bool = False,
                 python: Optional[str] = None) -> None:
        self.spec = spec
        self.on_event = on_event
        self.verbose = verbose
        self.python = python or sys.executable
        self.procs: Dict[int, subprocess.Popen] = {}
        self.events: "queue.Queue" = queue.Queue()
        self.tails: Dict[int, collections.deque] = {}
        self.errors: Dict[int, dict] = {}
        self.last_heard: Dict[int, float] = {}
        self.done = False
        self.done_at = 0.0
        self.eofs = 0
        self.unresponsive_after = max(60.0, spec.timeout + 2 * WATCHDOG_GRACE)

    # --------------------------------------------------------------- processes
    def _start(self, rank: int, store_arg: str) -> None:
        cmd = [self.python, "-m", "linkescape.bench.runner", "--rank", str(rank), "--store", store_arg,
               "--spec", json.dumps(self.spec.to_dict())]
        # a gated run's rank 0 reads the launcher's turns on its standard input (Rank.gate)
        stdin = subprocess.PIPE if self.spec.gated and rank == 0 else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        self.procs[rank] = proc
        self.tails[rank] = collections.deque(maxlen=40)
        self.last_heard[rank] = time.monotonic()
        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            threading.Thread(target=self._read, args=(rank, stream, name), daemon=True).start()

    def _read(self, rank: int, stream, name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if name == "stdout" and line.startswith(EVENT_PREFIX):
                event = jsonl.parse(line[len(EVENT_PREFIX):])
                if event is not None:
                    self.events.put((rank, event))
                    continue
            self.events.put((rank, {"event": "line", "stream": name, "line": line}))
        stream.close()
        self.events.put((rank, {"event": "eof", "stream": name}))

    def go(self) -> None:
        """A gated run: rank 0's turn to measure the next step."""
        proc = self.procs[0]
        proc.stdin.write(b"go\n")
        proc.stdin.flush()

    # hooks of a launcher that runs another job beside the ranks (mpi.MpiLauncher)
    def _deliver(self, rank: int, ev: dict) -> None:
        """A rank's result event (ranks, op, row)."""
        self.on_event(ev)

    def _other(self, rank, ev: dict) -> None:
        """An event of something other than a rank process."""

    def _others_check(self) -> None:
        """Raises BenchError when the other job failed."""

    def _others_done(self) -> bool:
        return True

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in self.procs.values():
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _failure(self, rank: int, what: str) -> BenchError:
        err = self.errors.get(rank)
        lines = [f"rank {rank} {what}"]
        if err:
            lines[0] += f": {err.get('message')}"
            if err.get("phase"):
                lines.append(f"  during: {err['phase']}")
            if self.verbose and err.get("traceback"):
                lines.append(err["traceback"].rstrip())
        tail = [l for l in self.tails.get(rank, ()) if l.strip()]
        if tail and not self.verbose:
            lines.append(f"  last output of rank {rank}:")
            lines.extend("    " + l for l in tail[-15:])
        others = sorted(r for r in self.errors if r != rank)
        for r in others:
            lines.append(f"rank {r}: {self.errors[r].get('message')}")
        return BenchError("\n".join(lines))

    # --------------------------------------------------------------- main loop
    def run(self) -> None:
        spec = self.spec
        tmpdir = None
        try:
            if spec.store == "file":
                tmpdir = tempfile.mkdtemp(prefix="linkescape-bench-")
                for r in range(spec.world_size):
                    self._start(r, f"file:{tmpdir}")
            else:
                self._start(0, "tcp:127.0.0.1:0")
            self._loop()
        except KeyboardInterrupt:
            self.kill_all()
            raise
        except BaseException:
            self.kill_all()
            raise
        finally:
            if tmpdir is not None:
                import shutil

                shutil.rmtree(tmpdir, ignore_errors=True)

    def _loop(self) -> None:
        spec = self.spec
        while True:
            try:
                rank, ev = self.events.get(timeout=0.5)
            except queue.Empty:
                rank, ev = None, None
            now = time.monotonic()
            if ev is not None and rank not in self.procs:
                self._other(rank, ev)
                ev = None
            if ev is not None:
                self.last_heard[rank] = now
                kind = ev.get("event")
                if kind == "store":
                    for r in range(1, spec.world_size):
                        self._start(r, f"tcp:127.0.0.1:{ev['port']}")
                elif kind == "line":
                    self.tails[rank].append(ev["line"])
                    if self.verbose:
                        print(f"[rank {rank}] {ev['line']}", file=sys.stderr, flush=True)
                elif kind == "error":
                    self.errors.setdefault(rank, ev)
                elif kind == "done":
                    self.done = True
                    self.done_at = now
                elif kind == "eof":
                    self.eofs += 1
                elif kind != "alive":
                    self._deliver(rank, ev)
            # exits
            for r, proc in sorted(self.procs.items()):
                rc = proc.poll()
                if rc is not None and rc != 0:
                    self._drain()
                    self.kill_all()
                    raise self._failure(r, _exit_text(rc))
            self._others_check()
            if self.procs and len(self.procs) == spec.world_size and all(p.poll() == 0 for p in self.procs.values()) \
                    and self._others_done():
                self._drain()
                if not self.done:
                    raise BenchError("the ranks exited without finishing the benchmark")
                return
            if self.done and now - self.done_at > WATCHDOG_GRACE:
                left = [r for r, p in sorted(self.procs.items()) if p.poll() is None]
                if left:  # every rank waits for the others at the end (Rank.finish): one still here hangs
                    self._drain()
                    self.kill_all()
                    raise self._failure(left[0], f"did not exit within {WATCHDOG_GRACE:.0f}s of the run's end")
            for r, heard in self.last_heard.items():
                if now - heard > self.unresponsive_after and self.procs[r].poll() is None:
                    self.kill_all()
                    raise BenchError(f"rank {r} said nothing for {now - heard:.0f}s; stopped every rank")

    def _drain(self) -> None:
        """Take the events still in the pipes (a failing rank's last words,
        the last rows of a finished run)."""
        deadline = time.monotonic() + 2.0
        while self.eofs < 2 * len(self.procs) and time.monotonic() < deadline:
            try:
                rank, ev = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if rank not in self.procs:
                self._other(rank, ev)
                continue
            kind = ev.get("event")
            if kind == "eof":
                self.eofs += 1
            elif kind == "error":
                self.errors.setdefault(rank, ev)
            elif kind == "done":
                self.done = True
            elif kind == "line":
                self.tails[rank].append(ev["line"])
                if self.verbose:
                    print(f"[rank {rank}] {ev['line']}", file=sys.stderr, flush=True)
            elif kind in ("op", "row", "ranks"):
                self._deliver(rank, ev)


def _exit_text(rc: int) -> str:
    if rc < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return {3: "timed out (its watchdog ended it)", 4: "lost its launcher"}.get(rc, f"failed (exit status {rc})")


def run_env(spec: BenchSpec, on_event: Callable[[dict], None]) -> None:
    """Run as one rank of a job started by torchrun (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); rank 0 reports through ``on_event``."""
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise BenchError(f"--launcher env needs RANK, WORLD_SIZE and MASTER_PORT from torchrun ({exc})") from None
    spec.world_size = world
    spec.validate()
    for key, value in child_env({}).items():
        os.environ.setdefault(key, value)
    events: List[dict] = []

    def emit(ev: dict) -> None:
        if ev.get("event") == "error":
            events.append(ev)
        elif rank == 0 and ev.get("event") not in ("alive", "done", "store"):
            on_event(ev)

    wd = Watchdog(spec.timeout + WATCHDOG_GRACE, emit, rank, watch_parent=False)
    wd.start()
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store_arg = f"tcp:{host}:{port}"
    if spec.store == "file":
        raise BenchError("--launcher env uses torchrun's TCP store")
    if agent:
        # torchrun's agent already serves the store at MASTER_PORT: connect as a client.
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(host, port, world, False, timeout=datetime.timedelta(seconds=spec.timeout))
        rank_obj = Rank(spec, rank, dist.PrefixStore("linkescape-bench", store), emit, wd)
        try:
            rank_obj.setup()
            rank_obj.run()
        except BaseException as exc:  # noqa: BLE001
            rank_obj.close(abort=True)
            raise BenchError(f"rank {rank}: {type(exc).__name__}: {exc}") from exc
        return
    if run_rank(spec, rank, store_arg, emit, wd) != 0:
        err = events[0] if events else {}
        raise BenchError(f"rank {rank}: {err.get('message', 'failed')}")


if __name__ == "__main__":  # pragma: no cover - started by LocalLauncher
    from .leave import leave

    leave(rank_main())  # (not the interpreter's finalization: see bench/leave.py)
