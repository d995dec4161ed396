"""Direct exchanges: all_to_all, gather, scatter, small all_gather, send/recv.

Every pair exchanges its block directly; the engine runs all of them at once.
"""

from __future__ import annotations

from .base import Schedule


def all_to_all(s: Schedule, out_raw: memoryview, in_raw: memoryview) -> None:
    n, r = s.world_size, s.rank
    size = len(in_raw) // n
    out_raw[r * size:(r + 1) * size] = in_raw[r * size:(r + 1) * size]
    # Start with the nearest ranks so no rank is hit by everyone at once.
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        s.send(dst, in_raw[dst * size:(dst + 1) * size])
        s.recv(src, size, dst=out_raw[src * size:(src + 1) * size])


def all_gather_direct(s: Schedule, out_raw: memoryview) -> None:
    """Block ``rank`` of ``out_raw`` is filled; every rank sends it to all."""
    n, r = s.world_size, s.rank
    size = len(out_raw) // n
    mine = out_raw[r * size:(r + 1) * size]
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        s.send(dst, mine)
        s.recv(src, size, dst=out_raw[src * size:(src + 1) * size])


def gather(s: Schedule, out_raw, in_raw: memoryview, root: int) -> None:
    n, r = s.world_size, s.rank
    size = len(in_raw)
    if r != root:
        s.send(root, in_raw)
        return
    out_raw[r * size:(r + 1) * size] = in_raw
    for k in range(1, n):
        src = (r + k) % n
        s.recv(src, size, dst=out_raw[src * size:(src + 1) * size])


def scatter(s: Schedule, out_raw: memoryview, in_raw, root: int) -> None:
    n, r = s.world_size, s.rank
    size = len(out_raw)
    if r != root:
        s.recv(root, size, dst=out_raw)
        return
    out_raw[:] = in_raw[r * size:(r + 1) * size]
    for k in range(1, n):
        dst = (r + k) % n
        s.send(dst, in_raw[dst * size:(dst + 1) * size])
