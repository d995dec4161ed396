"""The outbound half of a peer: posted sends carved into frames on the
active link(s), the replay of everything unacknowledged after a failover,
and acknowledgements."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Deque, List

from ..protocol.frames import FLAG_ACK_NOW, Kind, pack_header
from ..protocol.linkstate import Ev
from .io import POLLIN, POLLOUT
from .link import Link, WireItem
from .messages import OutMessage

if TYPE_CHECKING:
    from .peer import PeerChannel


class Sender:
    def __init__(self, peer: "PeerChannel") -> None:
        self.peer = peer
        self.queue: Deque[OutMessage] = collections.deque()
        #: every unacknowledged frame must be queued again (after a failover)
        self.replay = False
        #: the peer waits for an acknowledgement: send one in this round
        self.ack_urgent = False
        #: payload bytes queued again after failovers (a metric)
        self.replayed_bytes = 0

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.replay

    def post(self, m: OutMessage) -> None:
        self.queue.append(m)

    def cancel(self, m: OutMessage) -> None:
        if m in self.queue:
            self.queue.remove(m)

    def _links(self) -> List[Link]:
        peer = self.peer
        return [l for l in (peer.links[r] for r in peer.active) if l is not None]

    def pump(self) -> None:
        """Carve ready bytes into frames on the active link(s), as far as the
        watermark lets, and write."""
        peer = self.peer
        links = self._links()
        if not links:
            return
        schan, rchan = peer.send, peer.recv
        rails = peer.host.rails_word
        if self.replay:
            self.replay = False
            ack = rchan.cumulative_ack
            for i, frame in enumerate(schan.unacked):
                self.replayed_bytes += frame.length
                link = links[i % len(links)]
                link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, frame.msg, frame.offset, frame.length,
                                                frame.sig, arg=frame.arg, flags=frame.flags, rails=rails), frame))
            rchan.ack_sent_upto(ack)
        queue = self.queue
        host = peer.host
        chunk = host.config.chunk_bytes
        copy_bytes = host.config.copy_bytes
        watermark = host.watermark
        while queue:
            m = queue[0]
            if m.carved >= m.ready and m.nbytes:
                break
            link = links[0] if len(links) == 1 else min(links, key=lambda l: l.out_bytes)
            if link.out_bytes >= watermark:
                break
            n = min(chunk, m.ready - m.carved)
            off = m.carved
            copy = n <= copy_bytes
            frame = schan.emit(m.msg, m.sig, off, m.view[off:off + n], copy=copy)
            frame.arg = m.nbytes
            op = m.op
            op.last_seq[peer.rank] = frame.seq
            flags = 0 if copy and not op.need_ack else FLAG_ACK_NOW
            frame.flags = flags
            ack = rchan.cumulative_ack
            link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, m.msg, off, n, m.sig, arg=m.nbytes,
                                            flags=flags, rails=rails), frame))
            rchan.ack_sent_upto(ack)
            m.carved += n
            if m.carved == m.nbytes:
                queue.popleft()
        for link in links:
            if link.out:
                self.flush(link)

    def flush(self, link: Link) -> None:
        """Write what the socket takes; a write error takes the link down."""
        try:
            emptied = link.flush()
        except OSError as exc:
            from .peer import failure_event

            self.peer.link_down(link, failure_event(exc), detail=f"send: {exc}")
            return
        now = link.last_sent = time.monotonic()
        if link.pending_since is None:
            # bytes of ours wait for the peer kernel's ack from now: the peer
            # stays hot (watched) until a silence check saw them acknowledged
            link.pending_since = now
            link.silent_at = now + self.peer.host.config.silent_timeout
        want = POLLIN if emptied else POLLIN | POLLOUT
        if link.parked:
            want &= ~POLLIN
        self.peer.host.io.want(link, want)

    def control(self, link: Link, kind: int, arg: int = 0) -> None:
        """Queue a control frame (it carries our cumulative ack) and write."""
        rchan = self.peer.recv
        link.queue_control(kind, rchan.cumulative_ack, arg=arg, rails=self.peer.host.rails_word)
        rchan.ack_sent_upto(rchan.cumulative_ack)
        self.flush(link)

    def send_ack(self) -> None:
        links = self._links()
        if not links:
            return
        self.ack_urgent = False
        self.control(links[0], Kind.ACK)
