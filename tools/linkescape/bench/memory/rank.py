"""One rank of the memory benchmark: ``python -m linkescape.bench.memory.rank --case JSON ...``.

The rank runs the case's call ``warmup + ops`` times, on buffers allocated
afresh for every call (``--buffers fresh``) or on the same ones every time
(``--buffers reused``, the control), and samples its resident memory every
``every`` operations from the end of the warm-up on. Nothing is collected
by hand: whatever the library keeps alive stays alive as it would in a job.

Values: rank ``r``'s input of operation ``i`` is ``j % 251 + row + c + r``
(``j`` the element within a row, ``c = i % 97``), so every result element is
``A * (j % 251) + B * q + C`` for constants of the call (``q`` the row of a
per-rank output) and is checked exactly at 61 places spread over the buffer
after every operation.

Prints JSON lines: ``ready``, then ``series`` (``ops``, ``rss``, ``ring``:
the samples; ``wrong``: operations with a wrong element; ``seconds``), then
``exit``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from typing import Any, List, Optional, Tuple

import numpy as np

from ...common.jsonl import say
from .cases import Case

ROWS_KINDS = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")


def rss() -> int:
    """Resident bytes of this process (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Values:
    """The inputs of every call and the exact value of every result element."""

    def __init__(self, case: Case, world: int, rank: int, nonroot_reduce: bool = True) -> None:
        self.case, self.w, self.r = case, world, rank
        #: a non-root rank of reduce keeps its input (linkescape); Gloo leaves partial sums there
        self.nonroot_reduce = nonroot_reduce
        n = max(1, case.nbytes // 4)
        self.m = max(1, n // world)
        self.base1 = (np.arange(n) % 251).astype(np.float32)  # the whole buffer
        self.base_m = (np.arange(self.m) % 251).astype(np.float32)  # one rank's part
        self.base2 = (self.base_m[None, :] + np.arange(world, dtype=np.float32)[:, None]).reshape(-1)  # row q: + q
        self.s = sum(range(world))

    def input_base(self, root: int) -> Tuple[Optional[np.ndarray], float]:
        """The array an input is made from and what is added to it (None: this rank has no input)."""
        k, r, w = self.case.kind, self.r, self.w
        if k in ("all_reduce", "broadcast", "reduce", "sendrecv"):
            return self.base1, float(r)
        if k in ("all_gather", "gather"):
            return self.base_m, float(r)
        if k == "reduce_scatter":
            return self.base2, float(r)
        if k == "all_to_all":
            return self.base2, float(w * r)
        if k == "scatter":
            return (self.base2, 0.0) if r == root else (None, 0.0)
        return None, 0.0

    def output_size(self, root: int) -> int:
        """Elements of a separate output buffer (0: the call works in place, or has none here)."""
        k = self.case.kind
        if k in ("all_gather",) or (k == "gather" and self.r == root):
            return self.w * self.m
        if k in ("reduce_scatter", "scatter"):
            return self.m
        if k in ("all_to_all", "sendrecv"):
            return self.w * self.m if k == "all_to_all" else len(self.base1)
        return 0

    def coefficients(self, c: int, root: int) -> Optional[Tuple[float, float, float]]:
        """(A, B, C) of the result on this rank; None where the call leaves nothing to check."""
        k, r, w, s = self.case.kind, self.r, self.w, self.s
        if k == "all_reduce" or (k == "reduce" and r == root):
            return w, 0, w * c + s
        if k == "reduce":
            return (1, 0, c + r) if self.nonroot_reduce else None
        if k == "broadcast":
            return 1, 0, c + root
        if k == "all_gather" or (k == "gather" and r == root):
            return 1, 1, c
        if k == "reduce_scatter":
            return w, 0, w * (r + c) + s
        if k == "all_to_all":
            return 1, w, r + c
        if k == "scatter":
            return 1, 0, r + c
        if k == "sendrecv":
            return 1, 0, c + (r - 1) % w
        return None

    def wrong(self, result: np.ndarray, c: int, root: int) -> bool:
        coef = self.coefficients(c, root)
        if coef is None:
            return False
        flat = result.reshape(-1)
        idx = np.unique(np.linspace(0, flat.size - 1, 61).astype(np.int64))
        rows = self.m if self.case.kind in ROWS_KINDS and flat.size > self.m else flat.size
        want = coef[0] * ((idx % rows) % 251) + coef[1] * (idx // rows) + coef[2]
        return bool(np.any(flat[idx] != want.astype(np.float32)))


class NumpyCalls:
    """The calls on ``linkescape.Communicator`` with numpy arrays."""

    def __init__(self, store: str, rank: int, world: int) -> None:
        from linkescape import Communicator, FileStore

        self.comm = Communicator(FileStore(store, timeout=120), rank, world)
        self.rank, self.world = rank, world

    def make(self, base: np.ndarray, add: float, out: Optional[np.ndarray]) -> np.ndarray:
        return base + add if out is None else np.add(base, add, out=out)

    def empty(self, n: int) -> np.ndarray:
        return np.empty(n, np.float32)

    @staticmethod
    def array(x: Any) -> np.ndarray:
        return x

    def post(self, kind: str, inp, out, root: int, tag: int, async_op: bool) -> List[Any]:
        c, w, r = self.comm, self.world, self.rank
        m = None if out is None else out.reshape(w, -1) if kind in ("all_gather", "gather", "all_to_all") else out
        if kind == "sendrecv":
            return [c.send(inp, (r + 1) % w, tag=tag, async_op=True), c.recv(out, (r - 1) % w, tag=tag,
                                                                               async_op=True)]
        calls = {
            "all_reduce": lambda: c.all_reduce(inp, async_op=async_op),
            "broadcast": lambda: c.broadcast(inp, root, async_op=async_op),
            "reduce": lambda: c.reduce(inp, root, async_op=async_op),
            "all_gather": lambda: c.all_gather(m, inp, async_op=async_op),
            "reduce_scatter": lambda: c.reduce_scatter(out, inp.reshape(w, -1), async_op=async_op),
            "all_to_all": lambda: c.all_to_all(m, inp.reshape(w, -1), async_op=async_op),
            "gather": lambda: c.gather(m, inp, root, async_op=async_op),
            "scatter": lambda: c.scatter(out, None if inp is None else inp.reshape(w, -1), root, async_op=async_op),
            "barrier": lambda: c.barrier(async_op=async_op),
        }
        work = calls[kind]()
        return [work] if async_op else []

    def flight_bytes(self) -> Optional[int]:
        rec = getattr(self.comm, "flight_recorder", None)
        rec = rec() if callable(rec) else rec
        return rec.ring_bytes() if rec is not None and hasattr(rec, "ring_bytes") else None

    def close(self) -> None:
        self.comm.close()


class TorchCalls(NumpyCalls):
    """The same calls through ``torch.distributed`` on the ``linkescape`` backend, with torch tensors
    (or on torch's own ``gloo``: the reference run of a torch case, see :mod:`.run`)."""

    def __init__(self, store: str, rank: int, world: int, backend: str = "linkescape") -> None:
        import datetime

        import torch
        import torch.distributed as dist

        import linkescape.torch  # noqa: F401 - registers the backend

        self.torch, self.dist = torch, dist
        dist.init_process_group(backend, init_method=f"file://{store}.torch", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        self.comm = None
        if backend == "linkescape":
            from linkescape.torch import get_communicator

            self.comm = get_communicator()
        self.rank, self.world = rank, world
        self._bases: dict = {}

    def make(self, base: np.ndarray, add: float, out):
        t = self._bases.get(id(base))
        if t is None:
            t = self._bases[id(base)] = self.torch.from_numpy(base)
        return self.torch.add(t, add) if out is None else self.torch.add(t, add, out=out)

    def empty(self, n: int):
        return self.torch.empty(n, dtype=self.torch.float32)

    @staticmethod
    def array(x: Any) -> np.ndarray:
        return x.numpy()

    def post(self, kind: str, inp, out, root: int, tag: int, async_op: bool) -> List[Any]:
        d, w, r = self.dist, self.world, self.rank
        if kind == "sendrecv":
            ops = [d.P2POp(d.isend, inp, (r + 1) % w, tag=tag), d.P2POp(d.irecv, out, (r - 1) % w, tag=tag)]
            return list(d.batch_isend_irecv(ops))
        rows = None if out is None else list(out.view(w, -1).unbind(0))
        calls = {
            "all_reduce": lambda: d.all_reduce(inp, async_op=async_op),
            "broadcast": lambda: d.broadcast(inp, root, async_op=async_op),
            "reduce": lambda: d.reduce(inp, root, async_op=async_op),
            "all_gather": lambda: d.all_gather_into_tensor(out, inp, async_op=async_op),
            "reduce_scatter": lambda: d.reduce_scatter_tensor(out, inp, async_op=async_op),
            "all_to_all": lambda: d.all_to_all_single(out, inp, async_op=async_op),
            "gather": lambda: d.gather(inp, rows if r == root else None, dst=root, async_op=async_op),
            "scatter": lambda: d.scatter(out, None if inp is None else list(inp.view(w, -1).unbind(0)), src=root,
                                         async_op=async_op),
            "barrier": lambda: d.barrier(async_op=async_op),
        }
        work = calls[kind]()
        return [work] if async_op and work is not None else []

    def close(self) -> None:
        self.dist.destroy_process_group()


class Loop:
    """The case's calls, ``depth`` at a time, on fresh or reused buffers."""

    def __init__(self, case: Case, calls: NumpyCalls, values: Values, fresh: bool, keep_every: int = 0) -> None:
        self.case, self.calls, self.v, self.fresh = case, calls, values, fresh
        self.keep_every = keep_every
        self.kept: List[Any] = []  # --keep-every: a leak on purpose, to show the tool finds one
        self.slots: List[dict] = [{} for _ in range(case.depth)]
        self.wrong = 0

    def _buffers(self, k: int, root: int, add_c: int):
        base, add = self.v.input_base(root)
        slot = self.slots[k]
        inp = out = None
        if base is not None:
            inp = self.calls.make(base, add + add_c, None if self.fresh else slot.get("in"))
            if not self.fresh:
                slot["in"] = inp
        n_out = self.v.output_size(root)
        if n_out:
            out = self.calls.empty(n_out) if self.fresh else slot.get("out")
            if out is None:
                out = slot["out"] = self.calls.empty(n_out)
        return inp, out

    def step(self, i: int) -> None:
        """Operations ``i .. i + depth - 1``: posted together, waited in a random order, checked."""
        case, w = self.case, self.v.w
        async_op = case.mode == "async"
        posted = []
        for k in range(case.depth):
            op = i + k
            c, root = op % 97, op % w
            inp, out = self._buffers(k, root, c)
            works = self.calls.post(case.kind, inp, out, root, tag=k, async_op=async_op)
            posted.append((op, c, root, inp, out, works))
        waits = [wk for p in posted for wk in p[5]]
        random.Random(i * 31 + self.v.r).shuffle(waits)
        for wk in waits:
            wk.wait()
        for op, c, root, inp, out, _works in posted:
            result = inp if case.kind in ("all_reduce", "broadcast", "reduce") else out
            if result is not None and self.v.wrong(self.calls.array(result), c, root):
                self.wrong += 1
            if self.keep_every and op % self.keep_every == 0:
                self.kept.append(inp)


def run(args: argparse.Namespace) -> int:
    case = Case(**json.loads(args.case))
    error = None
    try:
        if case.api == "torch":
            calls = TorchCalls(args.store, args.rank, args.world, backend=args.backend)
        elif args.backend != "linkescape":
            raise ValueError(f"--backend {args.backend}: only the torch cases run on another backend")
        else:
            calls = NumpyCalls(args.store, args.rank, args.world)
        values = Values(case, args.world, args.rank, nonroot_reduce=args.backend == "linkescape")
        loop = Loop(case, calls, values, fresh=args.buffers == "fresh", keep_every=args.keep_every)
        say(event="ready", rank=args.rank, pid=os.getpid())
        ops, rss_, ring = [], [], []
        t_start = time.perf_counter()
        t_warm = None
        total = case.warmup + case.ops
        for i in range(0, total, case.depth):
            loop.step(i)
            done = i + case.depth - case.warmup
            if done == 0:
                t_warm = time.perf_counter()
            if done >= 0 and done % case.every == 0:
                ops.append(done)
                rss_.append(rss())
                ring.append(calls.flight_bytes())
        t_end = time.perf_counter()
        say(event="series", rank=args.rank, buffers=args.buffers, ops=ops, rss=rss_, ring=ring, wrong=loop.wrong,
            seconds=t_end - (t_warm or t_start), warmup_seconds=(t_warm or t_start) - t_start)
        calls.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    say(event="exit", rank=args.rank, error=error)
    sys.stdout.flush()
    os._exit(0 if error is None else 1)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m linkescape.bench.memory.rank")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--case", required=True, help="the Case as JSON")
    ap.add_argument("--buffers", choices=("fresh", "reused"), required=True)
    ap.add_argument("--backend", choices=("linkescape", "gloo"), default="linkescape",
                    help="torch cases: the process group's backend (gloo: the reference run)")
    ap.add_argument("--keep-every", type=int, default=0,
                    help="keep every Nth operation's input alive (a leak on purpose)")
    args = ap.parse_args(argv)
    import faulthandler
    import signal

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher asks before killing a hung rank
    return run(args)


if __name__ == "__main__":  # pragma: no cover - started by the launcher
    sys.exit(main())
