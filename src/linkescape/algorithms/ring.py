"""Pipelined rings for large messages: all_reduce, reduce-scatter, all_gather, chain broadcast.

The buffer is cut into one block per rank and the engine cuts each message
into frames; every rank forwards a frame as soon as it has reduced or copied
it, so sending, receiving and reducing overlap. The order in which values are
combined depends only on ring positions, never on timing or on the link that
carried the bytes: results are bit-identical on every rank and every run.
"""

from __future__ import annotations

import numpy as np

from .base import Schedule, blocks, byte_view, follow, gloo_blocks, reduce_into


def _rs_then_ag(s: Schedule, flat: np.ndarray, red, allgather: bool, d: int = 1, bl=None) -> None:
    """Reduce-scatter (rank r ends owning block r), optionally then all-gather,
    in place on ``flat``. Bytes go to rank r+d; block b is combined in the
    order ``x[b+d], x[b+2d], ..., x[b]``."""
    n, r = s.world_size, s.rank
    right, left = (r + d) % n, (r - d) % n
    isz = flat.dtype.itemsize
    if bl is None:
        bl = blocks(flat.shape[0], n)
    raw = byte_view(flat)

    def bview(b):
        lo, hi = bl[b % n]
        return raw[lo * isz:hi * isz]

    prev_recv = None
    steps = []
    for st in range(n - 1):  # reduce-scatter
        steps.append(((r - d * (st + 1)) % n, (r - d * (st + 2)) % n, True))
    if allgather:
        for st in range(n - 1):
            steps.append(((r - d * st) % n, (r - d * (st + 1)) % n, False))
    for i, (sb, rb, reducing) in enumerate(steps):
        snd = s.send(right, bview(sb), ready=None if i == 0 else 0)
        if prev_recv is not None:
            prev_recv.on_frame = follow(snd)
        dst = bview(rb)
        if reducing:
            prev_recv = s.recv(left, len(dst), dst=dst, reduce=reduce_into(flat, bl[rb][0] * isz, red))
        else:
            prev_recv = s.recv(left, len(dst), dst=dst)


def all_reduce(s: Schedule, flat: np.ndarray, red) -> None:
    _rs_then_ag(s, flat, red, allgather=True)


def all_reduce_gloo_order(s: Schedule, flat: np.ndarray, red) -> None:
    """The ring Gloo runs (bytes go to rank r-1, chunks cut as
    :func:`gloo_blocks`), so every element is combined in Gloo's order: for
    rounding types (float16, bfloat16) the result is Gloo's, bit for bit."""
    bl = gloo_blocks(flat.shape[0], flat.dtype.itemsize, s.world_size)
    _rs_then_ag(s, flat, red, allgather=True, d=-1, bl=bl)


def reduce_scatter_inplace(s: Schedule, flat: np.ndarray, red) -> None:
    """After it, block ``rank`` of ``flat`` holds the reduction."""
    _rs_then_ag(s, flat, red, allgather=False)


def all_gather(s: Schedule, out_flat: np.ndarray) -> None:
    """``out_flat`` holds world_size equal blocks; block ``rank`` is filled."""
    n, r = s.world_size, s.rank
    right, left = (r + 1) % n, (r - 1) % n
    raw = byte_view(out_flat)
    size = len(raw) // n

    def bview(b):
        b %= n
        return raw[b * size:(b + 1) * size]

    prev = None
    for st in range(n - 1):
        snd = s.send(right, bview(r - st), ready=None if st == 0 else 0)
        if prev is not None:
            prev.on_frame = follow(snd)
        prev = s.recv(left, size, dst=bview(r - st - 1))


def chain_broadcast(s: Schedule, raw: memoryview, root: int) -> None:
    """Root -> root+1 -> ... pipelined frame by frame."""
    n, r = s.world_size, s.rank
    pos = (r - root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n
    if pos == 0:
        s.send(nxt, raw)
        return
    rcv = s.recv(prv, len(raw), dst=raw)
    if pos < n - 1:
        rcv.on_frame = follow(s.send(nxt, raw, ready=0))


def reduce_to_root(s: Schedule, work: np.ndarray, red, root: int) -> None:
    """Ring reduce-scatter on ``work`` (the root's output buffer, or a scratch
    copy elsewhere), then every rank sends its reduced block to the root."""
    n, r = s.world_size, s.rank
    _rs_then_ag(s, work, red, allgather=False)
    isz = work.dtype.itemsize
    bl = blocks(work.shape[0], n)
    raw = byte_view(work)
    if r != root:
        lo, hi = bl[r]
        snd = s.send(root, raw[lo * isz:hi * isz], ready=0)
        last = s.op.recvs[-1] if n > 1 else None
        if last is not None:
            prev = last.on_frame

            def on_frame(received, prev=prev):
                if prev is not None:
                    prev(received)
                snd.ready = received
            last.on_frame = on_frame
        return
    for p in range(n):
        if p != root:
            lo, hi = bl[p]
            s.recv(p, (hi - lo) * isz, dst=raw[lo * isz:hi * isz])
