"""Latency algorithms for small messages: recursive doubling and binomial trees.

Each step sends a snapshot of the accumulator, so a reduction that lands in
the accumulator can never change bytes not yet sent. Pairs combine as
``lower rank's value OP higher rank's value``; IEEE addition and
multiplication are commutative, so both partners hold the same bits and every
rank ends with identical results.
"""

from __future__ import annotations

import functools

import numpy as np

from .base import Schedule, byte_view, gloo_blocks, pow2_below


@functools.lru_cache(maxsize=64)
def _doubling(n: int, r: int) -> tuple:
    """(p2, extra, partners): rank ``r``'s steps of recursive doubling over ``n`` ranks
    (the same for every operation of a job: computed once)."""
    p2 = pow2_below(n)
    extra = n - p2
    steps = []
    if r < p2:
        if r < extra:
            steps.append(r + p2)
        d = 1
        while d < p2:
            steps.append(r ^ d)
            d *= 2
    return p2, extra, tuple(steps)


def all_reduce(s: Schedule, flat: np.ndarray, red) -> None:
    """Recursive doubling; ranks beyond the largest power of two fold in first."""
    n, r = s.world_size, s.rank
    p2, extra, steps = _doubling(n, r)
    nbytes = flat.nbytes
    acc = flat  # reduced in place
    raw = byte_view(flat)

    if r >= p2:  # fold into r - p2, get the result back
        s.send(r - p2, raw)
        s.recv(r - p2, nbytes, dst=raw)
        return

    # Each step: snapshot acc -> sbuf[k] (when the previous step is done), send it,
    # receive the partner's value into rbuf[k], then acc = acc OP rbuf[k].
    # (one scratch array for all of them: sbuf[k] is row k, rbuf[k] row nsteps + k)
    nsteps = len(steps)
    count = flat.shape[0]
    scratch = np.empty((2 * nsteps, count), flat.dtype)
    sraw = memoryview(scratch.reshape(-1).view(np.uint8))
    folding = r < extra
    sends = []
    recvs = []
    for k, partner in enumerate(steps):
        if folding and k == 0:
            sends.append(None)  # the folding rank sends nothing at this step
        else:
            sends.append(s.send(partner, sraw[k * nbytes:(k + 1) * nbytes], ready=0))
        recvs.append(s.recv(partner, nbytes, dst=sraw[(nsteps + k) * nbytes:(nsteps + k + 1) * nbytes]))
    # after the last step, the folded rank gets the result back
    back = s.send(r + p2, raw, ready=0) if folding else None
    # Receives from different partners arrive in any order; combine strictly in
    # step order: step k's value goes into the snapshot sent at step k+1.
    _Doubling(acc, scratch, steps, sends, recvs, back, red, r, nbytes).start_step(0)


class _Doubling:
    """The state of one recursive doubling: which steps' values arrived, the next to combine."""

    __slots__ = ("acc", "scratch", "steps", "sends", "arrived", "back", "red", "rank", "nbytes", "next")

    def __init__(self, acc, scratch, steps, sends, recvs, back, red, rank, nbytes) -> None:
        self.acc = acc
        self.scratch = scratch
        self.steps = steps
        self.sends = sends
        self.arrived = [False] * len(steps)
        self.back = back
        self.red = red
        self.rank = rank
        self.nbytes = nbytes
        self.next = 0
        for k, m in enumerate(recvs):
            m.on_frame = functools.partial(self.on_frame, k, m)

    def on_frame(self, k: int, m, received: int) -> None:
        if received == m.nbytes:
            self.arrived[k] = True
            self.advance()

    def start_step(self, k: int) -> None:
        if k < len(self.steps):
            snd = self.sends[k]
            if snd is not None:
                self.scratch[k] = self.acc  # the snapshot this step sends
                snd.ready = self.nbytes

    def advance(self) -> None:
        k = self.next
        steps, arrived, acc = self.steps, self.arrived, self.acc
        nsteps = len(steps)
        while k < nsteps and arrived[k]:
            got = self.scratch[nsteps + k]
            a, b = (acc, got) if self.rank < steps[k] else (got, acc)
            self.red(acc, a, b)
            k += 1
            self.next = k
            self.start_step(k)
            if k == nsteps and self.back is not None:
                self.back.ready = self.nbytes


@functools.lru_cache(maxsize=256)
def _tree(n: int, rel: int, root: int, radix: int = 2) -> tuple:
    """K-nomial tree over ranks relative to ``root``: (parent or None, children),
    as real ranks. The parent clears the lowest nonzero base-``radix`` digit;
    children set one of the zero digits below it, farthest last (radix 2: the
    binomial tree). Depth ``ceil(log_radix n)``; a rank has at most
    ``(radix - 1)`` children per digit below its lowest nonzero one. The same
    for every operation of a job: computed once per (n, rank, root, radix)."""
    parent = None
    if rel:
        low = 1
        while not (rel // low) % radix:
            low *= radix
        parent = (rel - (rel // low) % radix * low + root) % n
    children = []
    low = 1
    while low < n and not (rel // low) % radix:
        for v in range(1, radix):
            if rel + v * low < n:
                children.append((rel + v * low + root) % n)
        low *= radix
    return parent, tuple(children)


def broadcast(s: Schedule, raw: memoryview, root: int, hold: bool = False, radix: int = 2) -> list:
    """Binomial (``radix`` 2) or k-nomial tree from ``root``. ``hold``: the root's sends wait
    until the caller sets their ``ready`` (the value is still being made); returns them."""
    n, r = s.world_size, s.rank
    parent, children = _tree(n, (r - root) % n, root, radix)
    # receive from the parent, then forward to the children, farthest first
    rcv = s.recv(parent, len(raw), dst=raw) if parent is not None else None
    sends = [s.send(c, raw, ready=0 if rcv is not None or hold else None) for c in reversed(children)]
    if rcv is not None and sends:
        def on_frame(received, sends=sends, m=rcv):
            if received == m.nbytes:
                for snd in sends:
                    snd.ready = m.nbytes
        rcv.on_frame = on_frame
    return sends


def reduce(s: Schedule, flat: np.ndarray, root: int, red, out: np.ndarray, on_done=None, radix: int = 2) -> None:
    """Binomial (``radix`` 2) or k-nomial tree toward ``root``; ``out`` (root: the caller's
    buffer, others: a scratch copy) accumulates children's values in a fixed order;
    ``on_done()`` runs once they are combined into it."""
    n, r = s.world_size, s.rank
    parent, children = _tree(n, (r - root) % n, root, radix)
    nbytes = flat.nbytes
    # (one scratch block, a row per child: an inner rank of a wide tree has many children, and a
    # small call's set-up is a share of its CPU)
    rbufs = np.empty((len(children), flat.size), dtype=flat.dtype)
    raw = memoryview(rbufs.reshape(-1).view(np.uint8))
    parent_send = None
    if parent is not None:
        parent_send = s.send(parent, byte_view(out), ready=0 if children else None)
    state = {"left": len(children)}
    recvs = []
    for i, c in enumerate(children):
        recvs.append(s.recv(c, nbytes, dst=raw[i * nbytes:(i + 1) * nbytes]))
    # Children are combined in the order listed once all arrived (fixed order,
    # whatever order they arrive in).

    # (every child's message has ``nbytes``: one callback serves them all)
    def on_frame(received):
        if received == nbytes:
            state["left"] -= 1
            if state["left"] == 0:
                for buf in rbufs:
                    red(out, out, buf)
                if parent_send is not None:
                    parent_send.ready = nbytes
                if on_done is not None:
                    on_done()
    for m in recvs:
        m.on_frame = on_frame


def all_reduce_tree(s: Schedule, flat: np.ndarray, red, radix: int = 2) -> None:
    """A reduce to rank 0, then a broadcast from it, over one k-nomial tree, in one
    operation: 2(n-1) messages in all, against n log2 n for recursive doubling, in
    2 ceil(log_radix n) rounds. Where the ranks outnumber the cores (or the job is
    large), the CPU the messages cost and the wake-ups on the way, not the bytes,
    set the time: a wider tree has fewer hops for the same messages (NCCL picks
    trees for small messages at scale too; docs/benchmarks.md has the radix
    measured). Every rank ends with rank 0's bits; children are combined in a
    fixed order."""
    # a non-root sends its partial sum up from a copy; flat gets the result
    acc = flat if s.rank == 0 else flat.copy()
    down = broadcast(s, byte_view(flat), 0, hold=True, radix=radix)

    def release() -> None:
        for m in down:
            m.ready = flat.nbytes
    reduce(s, flat, 0, red, acc, on_done=release if s.rank == 0 else None, radix=radix)


def _reduce_gloo_order(flat: np.ndarray, vals, red) -> None:
    """Every rank's value at hand: combine each of Gloo's ring chunks in the
    order Gloo's ring does (chunk k: x[k-1], x[k-2], ..., x[k])."""
    n = len(vals)
    for k, (lo, hi) in enumerate(gloo_blocks(flat.shape[0], flat.dtype.itemsize, n)):
        if lo == hi:
            continue
        out = flat[lo:hi]
        red(out, vals[(k - 1) % n][lo:hi], vals[(k - 2) % n][lo:hi])
        for j in range(3, n + 1):
            red(out, out, vals[(k - j) % n][lo:hi])


def all_reduce_direct(s: Schedule, flat: np.ndarray, red, gloo_order: bool = False) -> None:
    """One round: every rank sends its value to every other rank, then all
    reduce the same values in rank order (identical bits everywhere), or in
    the order of Gloo's ring (``gloo_order``). Best for tiny messages, where
    the number of rounds, not bytes, sets the time."""
    n, r = s.world_size, s.rank
    nbytes = flat.nbytes
    mine = flat.copy()
    vals = [None] * n
    vals[r] = mine
    mine_raw = byte_view(mine)
    recvs = []
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        s.send(dst, mine_raw)
        vals[src] = np.empty_like(flat)
        recvs.append(s.recv(src, nbytes, dst=byte_view(vals[src])))
    state = {"left": n - 1}

    def on_frame(received, m):
        if received == m.nbytes:
            state["left"] -= 1
            if state["left"] == 0:
                if gloo_order:
                    _reduce_gloo_order(flat, vals, red)
                    return
                red(flat, vals[0], vals[1])
                for q in range(2, n):
                    red(flat, flat, vals[q])
    for m in recvs:
        m.on_frame = lambda received, m=m: on_frame(received, m)
