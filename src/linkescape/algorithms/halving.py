"""Recursive halving and doubling (Rabenseifner's all_reduce) for mid-size
messages on many ranks.

A ring moves each byte 2(n-1)/n times in 2(n-1) steps; so does this, in
2 log2(n) steps: reduce-scatter by recursive halving (at distance d = n/2,
n/4, ..., 1 each rank gives away half of its region to its partner r ^ d and
reduces the other half with the partner's copy), then all-gather by
recursive doubling (d = 1, 2, ..., n/2). Where the ranks outnumber the cores
(or the job is large), every step costs a rank a wake-up and its frames'
handling, so log2 n steps beat n - 1.

Each element's final value is computed once, by the rank that owns it after
the halving, in an order fixed by the ranks alone (``lower rank's value OP
higher rank's``), and then copied to every rank: results are bit-identical
on every rank and from run to run. Ranks beyond the largest power of two fold
into a partner first and get the result back.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from .base import Schedule, byte_view, pow2_below


def _regions(count: int, r: int, p2: int) -> List[Tuple[int, int, int, int, int]]:
    """Per halving step (distance d from p2/2 down to 1): (partner, keep_lo,
    keep_hi, give_lo, give_hi) in elements."""
    lo, hi = 0, count
    out = []
    d = p2 // 2
    while d >= 1:
        mid = lo + (hi - lo) // 2
        partner = r ^ d
        if r & d:
            out.append((partner, mid, hi, lo, mid))
            lo = mid
        else:
            out.append((partner, lo, mid, mid, hi))
            hi = mid
        d //= 2
    return out


def all_reduce(s: Schedule, flat: np.ndarray, red) -> None:
    n, r = s.world_size, s.rank
    p2 = pow2_below(n)
    extra = n - p2
    nbytes = flat.nbytes
    isz = flat.dtype.itemsize
    raw = byte_view(flat)

    if r >= p2:  # fold into r - p2, get the result back
        s.send(r - p2, raw)
        s.recv(r - p2, nbytes, dst=raw)
        return

    def view(lo: int, hi: int) -> memoryview:
        return raw[lo * isz:hi * isz]

    steps = _regions(flat.shape[0], r, p2)
    h = len(steps)
    # Receives complete in any order (their partners differ); what they bring
    # is combined strictly in step order, so the sums' order is fixed.
    parts = [np.empty(khi - klo, flat.dtype) for _p, klo, khi, _g, _h in steps]
    fold_in = np.empty_like(flat) if r < extra else None  # the folded rank's value lands here
    st = {"combined": -1 if fold_in is not None else 0, "gathered": 0}
    arrived = [False] * h
    gathered = [False] * h

    fold = s.recv(r + p2, nbytes, dst=byte_view(fold_in)) if fold_in is not None else None
    sends, rcvs = [], []
    for k, (partner, klo, khi, glo, ghi) in enumerate(steps):
        sends.append(s.send(partner, view(glo, ghi), ready=0 if (k or fold is not None) else None))
        rcvs.append(s.recv(partner, (khi - klo) * isz, dst=byte_view(parts[k])))
    ag_sends, ag_rcvs = [], []
    for j, (partner, klo, khi, glo, ghi) in enumerate(reversed(steps)):
        ag_sends.append(s.send(partner, view(klo, khi), ready=0))
        ag_rcvs.append(s.recv(partner, (ghi - glo) * isz, dst=view(glo, ghi)))
    back = s.send(r + p2, raw, ready=0) if fold is not None else None

    def advance() -> None:
        k = st["combined"]
        if k < 0:
            return  # the folded rank's value first
        while k < h and arrived[k]:
            partner, klo, khi, _glo, _ghi = steps[k]
            mine = flat[klo:khi]
            if r < partner:
                red(mine, mine, parts[k])
            else:
                red(mine, parts[k], mine)
            k += 1
            st["combined"] = k
            if k < h:
                sends[k].ready = sends[k].nbytes  # its region is final now
        if k == h:
            j = st["gathered"]
            if j == 0 and h:
                ag_sends[0].ready = ag_sends[0].nbytes
            while j < h and gathered[j]:
                j += 1
                st["gathered"] = j
                if j < h:
                    ag_sends[j].ready = ag_sends[j].nbytes
            if j == h and back is not None:
                back.ready = nbytes

    def on_fold(received: int) -> None:
        if received == fold.nbytes:
            red(flat, flat, fold_in)  # lower rank's value OP higher rank's
            st["combined"] = 0
            if h:
                sends[0].ready = sends[0].nbytes
            advance()

    if fold is not None:
        fold.on_frame = on_fold
    def whole(flags: list, k: int, m) -> None:
        def on_frame(received: int) -> None:
            if received == m.nbytes:
                flags[k] = True
                advance()
        m.on_frame = on_frame

    for k, m in enumerate(rcvs):
        whole(arrived, k, m)
    for j, m in enumerate(ag_rcvs):
        whole(gathered, j, m)
    advance()
