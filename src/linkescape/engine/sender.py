"""The outbound half of a peer: posted sends carved into frames on the
route to the peer (its active link(s), or a relay through a third rank),
the replay of everything unacknowledged after the route changed, and
acknowledgements."""

from __future__ import annotations

import collections
from typing import Deque, List

from ..protocol.frames import ACK, DATA, FLAG_ACK_NOW, pack_header
from .io import POLLIN, POLLOUT
from .link import Link, WireItem
from .messages import OutMessage


class Sender:
    def __init__(self, peer: "PeerChannel") -> None:
        self.peer = peer
        self.queue: Deque[OutMessage] = collections.deque()
        #: every unacknowledged frame must be queued again (the route changed)
        self.replay = False
        #: the peer waits for an acknowledgement: send one in this round
        self.ack_urgent = False
        #: payload bytes queued again after failovers (a metric)
        self.replayed_bytes = 0

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.replay

    @property
    def ready(self) -> bool:
        """Frames could be carved now (a message at the head has bytes ready,
        or is empty) or replayed."""
        if self.replay:
            return True
        queue = self.queue
        if not queue:
            return False
        m = queue[0]
        return m.carved < m.ready or not m.nbytes

    def post(self, m: OutMessage) -> None:
        self.queue.append(m)

    def cancel(self, m: OutMessage) -> None:
        if m in self.queue:
            self.queue.remove(m)

    def links(self) -> List[Link]:
        """The links the peer's frames go on now (a relay's: the relay's own links)."""
        peer = self.peer
        if peer.relay is not None:
            return peer.relay.links()
        links = peer.links
        return [l for l in (links[r] for r in peer.active) if l is not None]

    def pump(self) -> None:
        """Carve ready bytes into frames on the route, as far as the watermark
        (and a relay's window) lets, and write."""
        peer = self.peer
        links = self.links()
        if not links:
            return
        relay = peer.relay
        wrap = relay.wrap if relay is not None else None
        outbound, inbound = peer.outbound, peer.inbound
        env = peer.env
        rails = env.rail_word.word
        if self.replay:
            self.replay = False
            ack = inbound.cumulative_ack
            nlinks = len(links)
            for i, frame in enumerate(outbound.unacked):
                n = frame.length
                self.replayed_bytes += n
                header = pack_header(DATA, frame.seq, ack, frame.msg, frame.offset, n, frame.sig, arg=frame.arg,
                                     flags=frame.flags, rails=rails)
                links[i % nlinks].queue(WireItem(header if wrap is None else wrap(header, frame), frame))
            inbound.ack_sent_upto(ack)
        queue = self.queue
        config = env.config
        chunk = config.chunk_bytes
        copy_bytes = config.copy_bytes
        watermark = env.watermark
        window = relay.window if relay is not None else 0
        rank = peer.rank
        while queue:
            m = queue[0]
            if m.carved >= m.ready and m.nbytes:
                break
            link = links[0] if len(links) == 1 else min(links, key=_out_bytes)
            if link.out_bytes >= watermark or (window and outbound.unacked_bytes >= window):
                break
            n = min(chunk, m.ready - m.carved)
            off = m.carved
            copy = n <= copy_bytes
            frame = outbound.emit(m.msg, m.sig, off, m.view[off:off + n], copy=copy)
            frame.arg = m.nbytes
            op = m.op
            op.last_seq[rank] = frame.seq
            flags = 0 if copy and not op.need_ack else FLAG_ACK_NOW
            frame.flags = flags
            ack = inbound.cumulative_ack
            header = pack_header(DATA, frame.seq, ack, m.msg, off, n, m.sig, arg=m.nbytes, flags=flags, rails=rails)
            link.queue(WireItem(header if wrap is None else wrap(header, frame), frame))
            inbound.ack_sent_upto(ack)
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
            self.peer.link_error(link, exc, "send")
            return
        env = self.peer.env
        now = link.last_sent = env.clock.now()
        if link.pending_since is None:
            # bytes of ours wait for the peer kernel's ack from now: the peer
            # stays hot (watched) until a silence check saw them acknowledged
            link.pending_since = now
            link.silent_at = now + env.config.silent_timeout
            env.soon(link.silent_at)
        if link.parked:  # (its read interest stays as it is: see Receiver._park)
            env.io.want_out(link, not emptied)
        else:
            env.io.want(link, POLLIN if emptied else POLLIN | POLLOUT)

    def control(self, link: Link, kind: int, arg: int = 0, relay=None) -> None:
        """Queue a control frame (it carries our cumulative ack) and write;
        through ``relay`` (a RelayPath) with its RELAY header and end-to-end trailer."""
        inbound = self.peer.inbound
        ack = inbound.cumulative_ack
        rails = self.peer.env.rail_word.word
        prefix = b"" if relay is None else relay.seal(pack_header(kind, 0, ack, arg=arg, rails=rails))
        link.queue_control(kind, ack, arg=arg, rails=rails, prefix=prefix)
        inbound.ack_sent_upto(ack)
        self.flush(link)

    def send_control(self, kind: int, arg: int = 0) -> bool:
        """A control frame to the peer on its route (relayed if it is);
        False when there is no route."""
        links = self.links()
        if not links:
            return False
        relay = self.peer.relay
        self.control(links[0], kind, arg=arg, relay=relay)
        return True

    def send_ack(self) -> None:
        self.ack_urgent = False
        self.send_control(ACK)


def _out_bytes(link: Link) -> int:
    return link.out_bytes
