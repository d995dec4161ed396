"""The two things being measured, behind one interface.

``call(case)`` returns a zero-argument function that runs the operation once
on the case's buffers; everything that can be prepared (tensors wrapping the
numpy buffers, reduce-op objects, peer numbers) is prepared before, so a
timed call is the library call and nothing else.
"""

from __future__ import annotations

import datetime
from typing import Callable, List, Optional

import numpy as np

from .cases import Case


def _noop() -> None:
    return None


class Backend:
    name = "?"

    def call(self, case: Case) -> Callable[[], None]:
        op = case.op
        a = case.arrays
        root = case.root
        if op == "barrier":
            return self.barrier
        if op == "send_recv":
            if case.rank == 0:
                return self._ping(a["buf"], a["tmp"])
            if case.rank == 1:
                return self._pong(a["tmp"])
            return _noop
        return getattr(self, "_" + op)(a, root, case.redop, case.rank)

    def barrier(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LinkescapeBackend(Backend):
    name = "linkescape"

    def __init__(self, store, rank: int, world_size: int, rails: Optional[List[str]], timeout: float) -> None:
        from .. import Communicator, Config

        config = Config.from_env(timeout=timeout, connect_timeout=timeout)
        try:
            self.comm = Communicator(store, rank, world_size, rails=rails, config=config)
        except OSError as exc:
            raise OSError(exc.errno, f"linkescape could not open rails {','.join(rails or [])}: "
                                     f"{exc.strerror or exc}") from exc
        self.rails = list(self.comm.rail_addrs)

    @staticmethod
    def _redop(name: str):
        from ..common.ops import ReduceOp

        return ReduceOp(name)

    def barrier(self) -> None:
        self.comm.barrier()

    def _all_reduce(self, a, root, redop, rank):
        c, buf, op = self.comm, a["buf"], self._redop(redop)
        return lambda: c.all_reduce(buf, op)

    def _broadcast(self, a, root, redop, rank):
        c, buf = self.comm, a["buf"]
        return lambda: c.broadcast(buf, root)

    def _reduce(self, a, root, redop, rank):
        c, buf, op = self.comm, a["buf"], self._redop(redop)
        return lambda: c.reduce(buf, root, op)

    def _all_gather(self, a, root, redop, rank):
        c, out, inp = self.comm, a["out"], a["inp"]
        return lambda: c.all_gather(out, inp)

    def _reduce_scatter(self, a, root, redop, rank):
        c, out, inp, op = self.comm, a["out"], a["inp"], self._redop(redop)
        return lambda: c.reduce_scatter(out, inp, op)

    def _all_to_all(self, a, root, redop, rank):
        c, out, inp = self.comm, a["out"], a["inp"]
        return lambda: c.all_to_all(out, inp)

    def _gather(self, a, root, redop, rank):
        c, out, inp = self.comm, a["out"], a["inp"]
        return lambda: c.gather(out, inp, root)

    def _scatter(self, a, root, redop, rank):
        c, out, inp = self.comm, a["out"], a["inp"]
        return lambda: c.scatter(out, inp, root)

    def _ping(self, buf, tmp):
        c = self.comm

        def ping():
            c.send(buf, 1)
            c.recv(tmp, 1)
        return ping

    def _pong(self, tmp):
        c = self.comm

        def pong():
            c.recv(tmp, 0)
            c.send(tmp, 0)
        return pong

    def close(self) -> None:
        self.comm.close()

    def abort(self) -> None:
        self.comm.abort()


class GlooBackend(Backend):
    """torch.distributed with backend "gloo" (CPU tensors sharing the numpy buffers)."""

    name = "gloo"

    def __init__(self, store, rank: int, world_size: int, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        dist.init_process_group("gloo", store=dist.PrefixStore("linkescape-bench/gloo", store), rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
        self._all_gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter_fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def t(self, arr: Optional[np.ndarray]):
        if arr is None:
            return None
        if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":
            return self.torch.from_numpy(arr.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(arr)

    def _redop(self, name: str):
        R = self.dist.ReduceOp
        return {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}[name]

    def barrier(self) -> None:
        self.dist.barrier()

    def _all_reduce(self, a, root, redop, rank):
        d, t, op = self.dist, self.t(a["buf"]), self._redop(redop)
        return lambda: d.all_reduce(t, op=op)

    def _broadcast(self, a, root, redop, rank):
        d, t = self.dist, self.t(a["buf"])
        return lambda: d.broadcast(t, src=root)

    def _reduce(self, a, root, redop, rank):
        d, t, op = self.dist, self.t(a["buf"]), self._redop(redop)
        return lambda: d.reduce(t, dst=root, op=op)

    def _all_gather(self, a, root, redop, rank):
        f, out, inp = self._all_gather_fn, self.t(a["out"].reshape(-1)), self.t(a["inp"])
        return lambda: f(out, inp)

    def _reduce_scatter(self, a, root, redop, rank):
        f, out, inp, op = self._reduce_scatter_fn, self.t(a["out"]), self.t(a["inp"].reshape(-1)), self._redop(redop)
        return lambda: f(out, inp, op=op)

    def _all_to_all(self, a, root, redop, rank):
        d, out, inp = self.dist, self.t(a["out"].reshape(-1)), self.t(a["inp"].reshape(-1))
        return lambda: d.all_to_all_single(out, inp)

    def _gather(self, a, root, redop, rank):
        d, inp = self.dist, self.t(a["inp"])
        outs = [self.t(row) for row in a["out"]] if rank == root else None
        return lambda: d.gather(inp, gather_list=outs, dst=root)

    def _scatter(self, a, root, redop, rank):
        d, out = self.dist, self.t(a["out"])
        ins = [self.t(row) for row in a["inp"]] if rank == root else None
        return lambda: d.scatter(out, scatter_list=ins, src=root)

    def _ping(self, buf, tmp):
        d, tb, tt = self.dist, self.t(buf), self.t(tmp)

        def ping():
            d.send(tb, 1)
            d.recv(tt, 1)
        return ping

    def _pong(self, tmp):
        d, tt = self.dist, self.t(tmp)

        def pong():
            d.recv(tt, 0)
            d.send(tt, 0)
        return pong

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    def abort(self) -> None:
        self.close()
