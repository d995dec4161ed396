"""What the algorithms post to the engine: messages, and the operation that owns them.

An algorithm posts, per peer and in a fixed order, the messages it sends and
receives. A send's bytes may become available progressively (``ready``), so a
pipelined schedule can forward a chunk as soon as it was reduced. A receive
either lands in the caller's memory (``dst``) or is reduced into it
(``reduce``), one whole frame at a time.
"""

from __future__ import annotations

import collections
from typing import Callable, Deque, Dict, List, Optional

from ..protocol.channel import address_range

#: the peer of a receive that takes the first matching send from any rank
ANY_SOURCE = -1

#: a collective's message number is ``epoch << EPOCH_SHIFT | seq``: each group a shrink makes
#: numbers its collectives above every one of the groups before it (see ``Matcher``)
EPOCH_SHIFT = 40


def enqueue(queues: Dict[int, Deque], key: int, item) -> None:
    """Append ``item`` to the queue of ``key`` (made when it has none)."""
    q = queues.get(key)
    if q is None:
        q = queues[key] = collections.deque()
    q.append(item)


def pop_first(queues: Dict[int, Deque], key: int):
    """Take the first item of ``key``'s queue; a queue that empties goes.

    Queues keyed by tag or message must not outlive their items: a job that
    uses a new tag for every message would otherwise keep one empty queue
    per tag it ever used."""
    q = queues[key]
    item = q.popleft()
    if not q:
        del queues[key]
    return item


def discard(queues: Dict[int, Deque], key: int, item) -> bool:
    """Remove ``item`` from ``key``'s queue if it is there (an emptied queue goes)."""
    q = queues.get(key)
    if not q or item not in q:
        return False
    q.remove(item)
    if not q:
        del queues[key]
    return True


class Op:
    """One collective or point-to-point operation in the engine."""

    __slots__ = ("seq", "name", "sends", "recvs", "pending_recvs", "error", "done", "finished", "deadline",
                 "views", "settle_until", "peers", "callbacks", "collective", "need_ack",
                 "last_seq", "source", "flight")

    def __init__(self, seq: int, name: str, deadline: float, collective: bool = True,
                 need_ack: bool = False) -> None:
        self.seq = seq
        #: collectives are numbered on every rank alike (p2p ops are not)
        self.collective = collective
        #: complete only once every frame was applied by its receiver, so a
        #: disagreement (two ranks both root) is found within this operation
        self.need_ack = need_ack
        #: highest frame seq sent to each peer for this op
        self.last_seq: dict = {}
        self.name = name
        self.sends: List["OutMessage"] = []
        self.recvs: List["InMessage"] = []
        self.pending_recvs = 0
        self.error: Optional[BaseException] = None
        self.done = False
        #: done and every completion callback has run (the finish steps that write the caller's
        #: buffers among them): what a waiter outside the engine lock may rely on
        self.finished = False
        self.deadline = deadline
        #: caller memory that zero-copy frames may point into
        self.views: List[memoryview] = []
        self.settle_until: Optional[float] = None
        self.peers: set = set()
        self.callbacks: List[Callable[["Op"], None]] = []
        #: the rank an any-source receive matched (None until it did)
        self.source: Optional[int] = None
        #: its flight-recorder slot while it runs (set by the recorder)
        self.flight = None

    def protect(self, view: memoryview) -> None:
        self.views.append(view)

    def release(self) -> None:
        """Done: let go of the messages, the caller's memory and the
        callbacks (they point back at the op: a cycle that would keep the
        caller's buffers alive until Python's cycle collector ran)."""
        self.sends = self.recvs = self.callbacks = self.views = ()

    def ranges(self) -> List[tuple]:
        return [address_range(v) for v in self.views if len(v)]

    @property
    def transferred(self) -> bool:
        if self.pending_recvs:
            return False
        for m in self.sends:
            if m.carved != m.nbytes:
                return False
        return True


class OutMessage:
    __slots__ = ("peer", "msg", "sig", "view", "nbytes", "ready", "carved", "op")

    def __init__(self, op: Op, peer: int, msg: int, sig: int, view: memoryview, ready: Optional[int] = None):
        self.op = op
        self.peer = peer
        self.msg = msg
        self.sig = sig
        self.view = view
        self.nbytes = len(view)
        self.ready = self.nbytes if ready is None else ready
        self.carved = 0


class InMessage:
    """A receive. ``dst`` gets the bytes; with ``reduce``, each whole frame is
    passed to ``reduce(offset, payload)`` instead, which applies it to memory."""

    __slots__ = ("peer", "msg", "sig", "nbytes", "received", "dst", "reduce", "on_frame", "op", "done")

    def __init__(self, op: Op, peer: int, msg: int, sig: int, nbytes: int, dst: Optional[memoryview] = None,
                 reduce: Optional[Callable[[int, memoryview], None]] = None,
                 on_frame: Optional[Callable[[int], None]] = None):
        self.op = op
        self.peer = peer
        self.msg = msg
        self.sig = sig
        self.nbytes = nbytes
        self.received = 0
        self.dst = dst
        self.reduce = reduce
        self.on_frame = on_frame
        self.done = False
