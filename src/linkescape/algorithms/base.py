"""What an algorithm sees: peers, byte views of buffers, and a schedule to post to.

Algorithms never touch a socket. They post, per peer and in a fixed order, the
messages they send and receive; a send may be made ready progressively, so a
pipelined schedule forwards each frame as soon as it was received or reduced.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ..engine.messages import InMessage, Op, OutMessage
from ..common.errors import InvalidBuffer

#: the largest message between two ranks (its size travels in a 32-bit field)
MAX_MESSAGE = (1 << 32) - 1


def byte_view(arr: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (no copy)."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def pow2_below(n: int) -> int:
    """The largest power of two <= n (the ranks of recursive doubling and halving)."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def blocks(count: int, parts: int) -> List[tuple]:
    """Split ``count`` elements into ``parts`` contiguous (start, stop) blocks."""
    return [(i * count // parts, (i + 1) * count // parts) for i in range(parts)]


def gloo_blocks(count: int, itemsize: int, parts: int) -> List[tuple]:
    """Gloo's ring chunks: ``parts`` chunks of ``parts``-aligned segments of
    ceil(bytes / 2·parts) bytes (element-rounded), the last ones short or
    empty. Chunk ``k`` is reduced starting at rank k-1 and going down the ring
    to rank k: ``((x[k-1] + x[k-2]) + ...) + x[k]``."""
    total = count * itemsize
    seg = -(-total // (2 * parts)) if total else itemsize
    seg = -(-seg // itemsize) * itemsize
    nseg = max(-(-total // seg), 2 * parts)
    per = -(-nseg // parts)  # segments per chunk
    elems = per * seg // itemsize
    return [(min(k * elems, count), min((k + 1) * elems, count)) for k in range(parts)]


class Schedule:
    """Builds one operation's messages. ``msg`` tags them (the collective's
    sequence number), ``sig`` carries what the ranks must agree on."""

    def __init__(self, op: Op, rank: int, world_size: int, msg: int, sig: int) -> None:
        self.op = op
        self.rank = rank
        self.world_size = world_size
        self.msg = msg
        self.sig = sig

    def send(self, peer: int, view: memoryview, ready: Optional[int] = None) -> OutMessage:
        check_message_size(len(view))
        m = OutMessage(self.op, peer, self.msg, self.sig, view, ready)
        self.op.sends.append(m)
        self.op.protect(view)
        return m

    def recv(self, peer: int, nbytes: int, dst: Optional[memoryview] = None,
             reduce: Optional[Callable[[int, memoryview], None]] = None,
             on_frame: Optional[Callable[[int], None]] = None) -> InMessage:
        check_message_size(nbytes)
        m = InMessage(self.op, peer, self.msg, self.sig, nbytes, dst=dst, reduce=reduce, on_frame=on_frame)
        self.op.recvs.append(m)
        self.op.pending_recvs += 1
        return m

    def then(self, fn: Callable[[Op], None]) -> None:
        """Run ``fn`` once every message of the operation is through."""
        self.op.callbacks.append(fn)


def check_message_size(nbytes: int) -> None:
    # every frame carries its message's size in 32 bits
    if nbytes > MAX_MESSAGE:
        raise InvalidBuffer(f"a message of {nbytes} bytes to one peer: at most {MAX_MESSAGE} are supported "
                            f"(split the buffer)")


def follow(send: OutMessage) -> Callable[[int], None]:
    """on_frame callback: make ``send`` ready as far as the receive has come."""
    def on_frame(received: int) -> None:
        send.ready = received
    return on_frame


def reduce_into(flat: np.ndarray, byte_offset: int, red) -> Callable[[int, memoryview], None]:
    """reduce callback: ``flat[...] = flat[...] OP payload`` for each frame."""
    dtype = flat.dtype
    isz = dtype.itemsize

    def apply(offset: int, payload: memoryview) -> None:
        start = (byte_offset + offset) // isz
        incoming = np.frombuffer(payload, dtype=dtype)
        target = flat[start:start + incoming.shape[0]]
        red(target, target, incoming)
    return apply
