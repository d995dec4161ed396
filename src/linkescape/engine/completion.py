"""Operations in flight: when each one is complete, and how one fails.

An operation is complete when every receive has its bytes and every send was
carved into frames, and then either acknowledged (rooted operations, which
must find a disagreement within themselves) or *settled*: no zero-copy frame
still points into the caller's memory (acks usually arrive within
microseconds; after a short wait the rest is copied).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, List

from ..errors import CommTimeout
from .messages import ANY_SOURCE, InMessage, Op

if TYPE_CHECKING:
    from .core import Engine
    from .peer import PeerChannel

log = logging.getLogger("linkescape.engine")


class OpTable:
    def __init__(self, host: "Engine") -> None:
        self.host = host
        self.ops: List[Op] = []
        #: seconds a finished op waits for acks before copying what is unacknowledged
        self.settle = 0.002

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
            self.check(op, time.monotonic())

    def check(self, op: Op, now: float) -> None:
        if op.done or not op.transferred:
            return
        peers = self.host.peers
        if op.need_ack:
            for p, seq in op.last_seq.items():
                if peers[p].send.acked < seq:
                    return
            self.complete(op)
            return
        pending = False
        for p, seq in op.last_seq.items():
            schan = peers[p].send
            if schan.acked < seq and schan.zc:
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
                    peers[p].send.materialize(lo, hi)
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

    def fail(self, op: Op, exc: BaseException) -> None:
        if op.done:
            return
        op.error = exc
        peers = self.host.peers
        # What this op had posted can never be matched now.
        for m in op.sends:
            peers[m.peer].tx.cancel(m)
        for m in op.recvs:
            if m.peer == ANY_SOURCE:
                q = self.host.any_recvs.get(m.msg)
                if q and m in q:
                    q.remove(m)
            else:
                peers[m.peer].rx.cancel(m)
        # ... nor may a replay later read memory the caller rewrites.
        for lo, hi in op.ranges():
            for p in op.last_seq:
                peers[p].send.materialize(lo, hi)
        self.complete(op)

    def fail_all(self, exc: BaseException) -> None:
        for op in list(self.ops):
            self.fail(op, exc)

    def fail_needing(self, peer: "PeerChannel", exc: BaseException) -> None:
        """Fail the operations that still need something from ``peer``."""
        rank = peer.rank
        acked = peer.send.acked
        for op in list(self.ops):
            if op.done or rank not in op.peers:
                continue
            if (any(m.peer == rank and not m.done for m in op.recvs)
                    or any(m.peer == rank and m.carved < m.nbytes for m in op.sends)
                    or (op.need_ack and op.last_seq.get(rank, 0) > acked)):
                self.fail(op, exc)

    def timeout(self, op: Op) -> None:
        waiting = sorted({m.peer for m in op.recvs if not m.done} |
                         {m.peer for m in op.sends if m.carved < m.nbytes})
        self.fail(op, CommTimeout(f"{op.name} (op {op.seq}) timed out waiting for ranks {waiting}",
                                  peers=waiting, op_seq=op.seq))
