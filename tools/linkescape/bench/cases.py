"""Buffers of one measurement, filled with known inputs, and the check of results.

Inputs are small integers, so every dtype holds them and every result
(sums of a few of them, products of ones and twos, minima, maxima) is exact:
a result either equals the expected value or is wrong. Each input is a short
periodic pattern, so filling and checking a 256 MiB buffer are a broadcast
assignment and a comparison, not a Python loop.

* Data-movement ops use ``move(s)``: values 1..113, different for every source
  ``s`` at every index (for fewer than 113 sources), so a block that lands in
  the wrong place is caught.
* Reductions use ``red(s)``: values 1..7 (1..2 for prod).
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .spec import OPS, layout, np_dtype

MOVE_PERIOD = 113
RED_PERIOD = 7


def move(seed: int, dtype: np.dtype) -> np.ndarray:
    return ((np.arange(MOVE_PERIOD, dtype=np.int64) + 17 * seed) % MOVE_PERIOD + 1).astype(dtype)


def red(seed: int, redop: str, dtype: np.dtype) -> np.ndarray:
    if redop == "prod":
        base = (np.arange(RED_PERIOD * 2, dtype=np.int64) + seed) % 2 + 1
    else:
        base = np.tile((np.arange(RED_PERIOD, dtype=np.int64) + 3 * seed) % RED_PERIOD + 1, 2)
    return base.astype(dtype)


def reduce_tiles(tiles, redop: str, world_size: int, dtype: np.dtype) -> np.ndarray:
    """The exact result of reducing the ranks' tiles, in ``dtype`` (integer
    overflow wraps around as it does on the wire)."""
    if dtype.kind in "iu":
        stack = np.stack([t.astype(np.int64) for t in tiles])
    else:
        stack = np.stack([t.astype(np.float64) for t in tiles])
    if redop in ("sum", "avg"):
        out = stack.sum(axis=0)
        if redop == "avg":
            out = out // world_size if dtype.kind in "iu" else out / world_size
    elif redop == "prod":
        out = stack.prod(axis=0)
    elif redop == "min":
        out = stack.min(axis=0)
    else:
        out = stack.max(axis=0)
    # int64 -> narrower integers: astype wraps modulo 2**bits, as the wire does
    return out.astype(dtype)


def fill(arr: np.ndarray, tile: np.ndarray) -> None:
    """Write ``tile`` periodically into the flat array ``arr``."""
    flat = arr.reshape(-1)
    p = tile.shape[0]
    m = flat.shape[0] // p * p
    if m:
        flat[:m].reshape(-1, p)[...] = tile
    flat[m:] = tile[: flat.shape[0] - m]


def count_wrong(arr: np.ndarray, tile: np.ndarray, approx: bool = False) -> int:
    """How many elements of the flat ``arr`` differ from the periodic ``tile``."""
    flat = arr.reshape(-1)
    p = tile.shape[0]
    m = flat.shape[0] // p * p
    if approx:
        def bad(a, b):
            return int(np.count_nonzero(~np.isclose(a.astype(np.float64), b.astype(np.float64),
                                                    rtol=1e-2, atol=0.0)))
    else:
        def bad(a, b):
            return int(np.count_nonzero(a != b))
    wrong = 0
    step = max(p, (1 << 22) // p * p)  # bound the temporaries (4M elements)
    for start in range(0, m, step):
        stop = min(start + step, m)
        wrong += bad(flat[start:stop].reshape(-1, p), tile[None, :])
    if m < flat.shape[0]:
        wrong += bad(flat[m:], tile[: flat.shape[0] - m])
    return wrong


class Case:
    """The buffers of one (op, size) on one rank; ``arrays`` holds numpy arrays
    by role (``buf``, ``inp``, ``out``, ``tmp``), absent roles are None."""

    def __init__(self, op: str, rank: int, world_size: int, size: int, dtype: str, redop: str = "sum",
                 root: int = 0) -> None:
        self.op = op
        self.rank = rank
        self.n = world_size
        self.dtype = np_dtype(dtype)
        self.redop = redop
        self.root = root
        self.nbytes, self.count, self.block = layout(op, size, self.dtype.itemsize, world_size)
        self.arrays: Dict[str, Optional[np.ndarray]] = {"buf": None, "inp": None, "out": None, "tmp": None}
        self._expected: Dict[str, object] = {}
        getattr(self, "_make_" + op)()

    # ----------------------------------------------------------------- per op
    def _empty(self, *shape) -> np.ndarray:
        return np.zeros(shape, self.dtype)

    def _make_all_reduce(self) -> None:
        buf = self._empty(self.count)
        fill(buf, red(self.rank, self.redop, self.dtype))
        self.arrays["buf"] = buf
        tiles = [red(r, self.redop, self.dtype) for r in range(self.n)]
        self._expected["buf"] = reduce_tiles(tiles, self.redop, self.n, self.dtype)

    def _make_reduce(self) -> None:
        self._make_all_reduce()
        if self.rank != self.root:
            # the root's result is what counts; gloo may use other ranks' buffers as scratch
            self._expected.pop("buf")

    def _make_broadcast(self) -> None:
        buf = self._empty(self.count)
        if self.rank == self.root:
            fill(buf, move(self.root, self.dtype))
        self.arrays["buf"] = buf
        self._expected["buf"] = move(self.root, self.dtype)

    def _make_all_gather(self) -> None:
        inp = self._empty(self.block)
        fill(inp, move(self.rank, self.dtype))
        self.arrays["inp"] = inp
        self.arrays["out"] = self._empty(self.n, self.block)
        self._expected["out"] = [move(q, self.dtype) for q in range(self.n)]

    def _make_gather(self) -> None:
        inp = self._empty(self.block)
        fill(inp, move(self.rank, self.dtype))
        self.arrays["inp"] = inp
        if self.rank == self.root:
            self.arrays["out"] = self._empty(self.n, self.block)
            self._expected["out"] = [move(q, self.dtype) for q in range(self.n)]

    def _make_scatter(self) -> None:
        if self.rank == self.root:
            inp = self._empty(self.n, self.block)
            for q in range(self.n):
                fill(inp[q], move(q, self.dtype))
            self.arrays["inp"] = inp
        self.arrays["out"] = self._empty(self.block)
        self._expected["out"] = move(self.rank, self.dtype)

    def _make_reduce_scatter(self) -> None:
        inp = self._empty(self.n, self.block)
        for q in range(self.n):
            fill(inp[q], red(self.rank + 2 * q, self.redop, self.dtype))
        self.arrays["inp"] = inp
        self.arrays["out"] = self._empty(self.block)
        tiles = [red(r + 2 * self.rank, self.redop, self.dtype) for r in range(self.n)]
        self._expected["out"] = reduce_tiles(tiles, self.redop, self.n, self.dtype)

    def _make_all_to_all(self) -> None:
        inp = self._empty(self.n, self.block)
        for q in range(self.n):
            fill(inp[q], move(self.rank * self.n + q, self.dtype))
        self.arrays["inp"] = inp
        self.arrays["out"] = self._empty(self.n, self.block)
        self._expected["out"] = [move(s * self.n + self.rank, self.dtype) for s in range(self.n)]

    def _make_send_recv(self) -> None:
        # ping-pong: rank 0 sends buf, rank 1 receives it into tmp and sends it back
        if self.rank == 0:
            buf = self._empty(self.count)
            fill(buf, move(0, self.dtype))
            self.arrays["buf"] = buf
        if self.rank in (0, 1):
            self.arrays["tmp"] = self._empty(self.count)
            self._expected["tmp"] = move(0, self.dtype)

    def _make_barrier(self) -> None:
        pass

    # ----------------------------------------------------------------- results
    def check(self) -> int:
        """Wrong elements on this rank after one run of the op on fresh buffers."""
        approx = self.redop == "avg" and self.dtype.kind not in "iu" and OPS[self.op].reduces
        wrong = 0
        for role, exp in self._expected.items():
            arr = self.arrays[role]
            if isinstance(exp, list):
                for q, tile in enumerate(exp):
                    wrong += count_wrong(arr[q], tile, approx)
            else:
                wrong += count_wrong(arr, exp, approx)
        return wrong

    def settle(self) -> None:
        """After the checked run: make in-place reductions a fixed point (0 for
        sum/avg, 1 for prod) so that repeating them neither overflows nor
        changes the amount of work."""
        if self.op in ("all_reduce", "reduce") and self.redop in ("sum", "avg", "prod"):
            self.arrays["buf"][...] = 1 if self.redop == "prod" else 0
