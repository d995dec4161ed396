"""Operations in flight: when each one is complete, and how one fails.

An operation is complete when every receive has its bytes and every send was
carved into frames, and then either acknowledged (rooted operations, which
must find a disagreement within themselves) or *settled*: no zero-copy frame
still points into the caller's memory (acks usually arrive within
microseconds; after a short wait the rest is copied).

A finished operation lets go of everything it held (its messages, their
views of the caller's memory, the algorithm's callbacks): an operation and
its messages point at each other, so without that the caller's buffers
would live until Python's cycle collector ran, and a job that hands each
step fresh buffers would grow.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional

from ..common.errors import CommTimeout
from .messages import ANY_SOURCE, InMessage, Op, discard

log = logging.getLogger("linkescape.engine")

#: ranks a timed-out operation's message describes (the path to each: ``PeerChannel.waiting_note``)
NOTED = 4


class OpTable:
    def __init__(self, peers: Dict[int, "PeerChannel"], matcher: "Matcher", clock) -> None:
        self.peers = peers
        self.matcher = matcher
        self.clock = clock
        self.ops: List[Op] = []
        #: seconds a finished op waits for acks before copying what is unacknowledged
        self.settle = 0.002
        #: (the engine's) the error of an operation past its timeout, when a rank without a path is
        #: the reason (None: CommTimeout)
        self.on_timeout: Optional[Callable[[Op], Optional[BaseException]]] = None

    def __bool__(self) -> bool:
        return bool(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, op: Op) -> None:
        self.ops.append(op)

    def recv_done(self, m: InMessage) -> None:
        m.done = True
        op = m.op
        op.pending_recvs -= 1
        if op.pending_recvs == 0:
            self.check(op, self.clock.now())

    def check(self, op: Op, now: float) -> None:
        if op.done or not op.transferred:
            return
        peers = self.peers
        if op.need_ack:
            for p, seq in op.last_seq.items():
                if peers[p].outbound.acked < seq:
                    return
            self.complete(op)
            return
        pending = False
        for p, seq in op.last_seq.items():
            if peers[p].zero_copy_pending(seq):
                pending = True
                break
        if pending:
            if op.settle_until is None:
                op.settle_until = now + self.settle
                return
            if now < op.settle_until:
                return
            for lo, hi in op.ranges():
                for p in op.last_seq:
                    peers[p].materialize(lo, hi)
        self.complete(op)

    def check_all(self, now: float) -> None:
        for op in list(self.ops):
            if not op.done:
                self.check(op, now)
            if not op.done and now > op.deadline:
                self.timeout(op)

    def complete(self, op: Op) -> None:
        op.done = True
        try:
            self.ops.remove(op)
        except ValueError:
            pass
        for cb in op.callbacks:
            try:
                cb(op)
            except Exception:  # noqa: BLE001
                log.exception("completion callback failed")
        op.release()
        op.finished = True

    def fail(self, op: Op, exc: BaseException) -> None:
        if op.done:
            return
        op.error = exc
        if op.collective:
            self.matcher.failed(op.seq)  # what the others still send for it is dropped, not a mismatch
        peers = self.peers
        # What this op had posted can never be matched now.
        for m in op.sends:
            peers[m.peer].cancel(m)
        for m in op.recvs:
            if m.peer == ANY_SOURCE:
                discard(self.matcher.any_recvs, m.msg, m)
            else:
                peers[m.peer].cancel(m)
        # ... nor may a replay later read memory the caller rewrites.
        for lo, hi in op.ranges():
            for p in op.last_seq:
                peers[p].materialize(lo, hi)
        self.complete(op)

    def fail_all(self, exc: BaseException) -> None:
        for op in list(self.ops):
            self.fail(op, exc)

    def fail_needing(self, peer: "PeerChannel", exc: BaseException) -> None:
        """Fail the operations that still need something from ``peer``."""
        rank = peer.rank
        for op in list(self.ops):
            if not op.done and rank in op.peers and peer.needs(op):
                self.fail(op, exc)

    def timeout(self, op: Op) -> None:
        exc = self.on_timeout(op) if self.on_timeout is not None else None
        if exc is not None:
            self.fail(op, exc)
            return
        waiting = sorted({m.peer for m in op.recvs if not m.done} |
                         {m.peer for m in op.sends if m.carved < m.nbytes})
        # what this rank knows of the path to the first few it waits for: a peer that says nothing
        # on a path that works is elsewhere (not in this collective, stopped); one without a path
        # is the network's (O(1): at most NOTED peers, whatever N)
        now = self.clock.now()
        notes = [self.peers[p].waiting_note(now) for p in waiting[:NOTED] if p in self.peers]
        more = f"; {len(waiting) - NOTED} more" if len(waiting) > NOTED else ""
        detail = f" ({'; '.join(notes)}{more})" if notes else ""
        self.fail(op, CommTimeout(f"{op.name} (op {op.seq}) timed out waiting for ranks {waiting}{detail}",
                                  peers=waiting, op_seq=op.seq))


OnDone = Callable[[Op], None]
