"""The inbound half of a peer: frames from its links into posted receives, in
seq order and exactly once, whatever link carried them.

- A frame is bound to where its payload goes (the caller's memory, a staging
  buffer for a reduction, an unexpected point-to-point buffer, or a discard
  buffer for a duplicate) before its payload is read.
- A link whose next frame cannot be placed yet (ahead of a gap another link
  will fill, or of a collective not posted yet) is *parked*: not read until
  the frame can be placed, so the frame lands in place without a copy.
- A link is never parked for long, though: what follows the frame (acks,
  notifications, rail state) must get through. After ``STASH_AFTER`` the
  frame is read into a buffer (the *stash*, bounded per peer) and applied from
  there once it can be; while the stash holds anything, frames that cannot
  be placed go straight to it.
- A reduction is applied only to a frame that arrived whole.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Deque, Dict, Optional

from ..errors import CollectiveMismatch, ProtocolError
from ..protocol.channel import AHEAD, DUPLICATE
from ..protocol.frames import FLAG_ACK_NOW, P2P_FLAG, Header, Kind
from ..protocol.linkstate import State
from .io import POLLIN, POLLOUT
from .link import Link
from .messages import InMessage

if TYPE_CHECKING:
    from .peer import PeerChannel


class Unexpected:
    """A point-to-point message that arrived before its receive was posted."""

    __slots__ = ("msg", "sig", "nbytes", "received", "buf", "done")

    def __init__(self, msg: int, sig: int, nbytes: int) -> None:
        self.msg = msg
        self.sig = sig
        self.nbytes = nbytes
        self.received = 0
        self.buf = memoryview(bytearray(nbytes))
        self.done = False


#: a parked link is read into the stash after this long
STASH_AFTER = 0.005
#: bytes a peer's stash may hold; beyond it links stay parked
STASH_LIMIT = 64 << 20
_STASH = object()  # the binding of a frame read into the stash


class Stashed:
    __slots__ = ("hdr", "payload")

    def __init__(self, hdr: Header, payload: memoryview) -> None:
        self.hdr = hdr
        self.payload = payload


class Receiver:
    def __init__(self, peer: "PeerChannel") -> None:
        self.peer = peer
        self.coll_recvs: Deque[InMessage] = collections.deque()
        self.p2p_recvs: Dict[int, Deque[InMessage]] = {}
        self.unexpected: Dict[int, Deque[Unexpected]] = {}
        #: the message whose frames are arriving now (frames of a message are contiguous)
        self.cur_in = None
        #: frames read before they could be placed, by seq
        self.stash: Dict[int, Stashed] = {}
        self.stash_bytes = 0

    # ------------------------------------------------------------ posting
    def post(self, m: InMessage) -> None:
        if m.msg & P2P_FLAG:
            tag = m.msg
            queue = self.unexpected.get(tag)
            if queue and queue[0].done:
                self._take_unexpected(queue.popleft(), m)
                return
            self.p2p_recvs.setdefault(tag, collections.deque()).append(m)
        else:
            self.coll_recvs.append(m)

    def _taker(self, tag: int):
        """The receive posted first for a whole unexpected message: this
        peer's own, or an any-source one."""
        queue = self.p2p_recvs.get(tag)
        anyq = self.peer.host.any_recvs.get(tag)
        if anyq and (not queue or anyq[0].op.seq < queue[0].op.seq):
            m = anyq.popleft()
            m.peer = self.peer.rank
            m.op.source = self.peer.rank
            m.op.peers.add(self.peer.rank)
            return m
        return queue.popleft() if queue else None

    def take_any(self, m: InMessage) -> bool:
        """An any-source receive being posted: take a whole unexpected
        message from this peer, if one waits."""
        queue = self.unexpected.get(m.msg)
        if queue and queue[0].done:
            m.peer = self.peer.rank
            m.op.source = self.peer.rank
            m.op.peers.add(self.peer.rank)
            self._take_unexpected(queue.popleft(), m)
            return True
        return False

    def waiting(self) -> bool:
        """A receive is posted (or a message half in) from this peer."""
        return bool(self.coll_recvs) or self.cur_in is not None or any(self.p2p_recvs.values())

    def cancel(self, m: InMessage) -> None:
        """A failed operation's receive: unmatch it, and make sure no frame
        half-read for it lands in memory the caller gets back now."""
        if m in self.coll_recvs:
            self.coll_recvs.remove(m)
        for q in self.p2p_recvs.values():
            if m in q:
                q.remove(m)
        if self.cur_in is m:
            self.cur_in = None
        for link in self.peer.links:
            if link is not None and link.binding is m:
                link.binding = None
                link.sink = self.peer.host.discard(len(link.sink))

    def _take_unexpected(self, u: Unexpected, m: InMessage) -> None:
        host = self.peer.host
        if u.nbytes != m.nbytes:
            host.ops.fail(m.op, CollectiveMismatch(
                f"recv of {m.nbytes} bytes from rank {self.peer.rank} matched a send of {u.nbytes} bytes",
                peer=self.peer.rank, op_seq=m.op.seq))
            return
        if m.nbytes:
            host.protect_range(m.dst)
            m.dst[:] = u.buf
        m.received = m.nbytes
        host.ops.recv_done(m)

    # ------------------------------------------------------------ reading
    def on_readable(self, link: Link) -> None:
        """Read and apply frames until the socket has no more (or the link
        parks or goes down). Raises LinkEscapeError / OSError to the caller."""
        if link.parked:
            return  # waiting for an earlier frame or a posted receive
        peer = self.peer
        bound = peer.host.config.max_frame_bytes
        while True:
            if link.hdr is None:
                hdr = link.read_header(bound)
                if hdr is None:
                    continue
                if hdr.ack:
                    peer.send.on_ack(hdr.ack)
                if hdr.rails != peer.peer_rails.word:
                    peer.on_peer_rails(hdr.rails)
                    if peer.links[link.rail] is not link:
                        return  # this very rail is down on the peer's side
                if hdr.kind != Kind.DATA:
                    peer.on_control(link, hdr)
                    if link.status.state is not State.UP or peer.links[link.rail] is not link:
                        return
                    continue
                link.hdr = hdr
                if not self.bind(link):
                    return
            if link.sink_got < len(link.sink):
                if not link.read_payload():
                    continue
            self.deliver(link)

    def bind(self, link: Link) -> bool:
        """Decide where the current frame's payload goes; False to park."""
        peer = self.peer
        host = peer.host
        hdr = link.hdr
        cls = peer.recv.classify(hdr.seq)
        if cls is AHEAD and hdr.seq in self.stash:
            cls = DUPLICATE  # a replay of a frame we hold already
        if cls is DUPLICATE:
            # a replay of something we have: our ack may have died with a link
            link.binding = None
            link.sink = host.discard(hdr.length)
            peer.recv.ack_sent = 0
            peer.tx.ack_urgent = True
        elif cls is AHEAD:
            if self.stash and self._to_stash(link):
                return True  # it follows frames the stash holds
            if any(other is not link and other.status.state is State.UP for other in peer.links if other):
                return self._park(link)  # the gap is on its way over another link (or the stash)
            # No other link can fill the gap: the frames missing are replayed
            # behind this one on this very link, and so is this one. Drop it.
            link.binding = None
            link.sink = host.discard(hdr.length)
        else:
            cur = self.cur_in
            if cur is None:
                cur = self._match(hdr)
                if cur is None:
                    return self._park(link)
                self.cur_in = cur
            elif cur.msg != hdr.msg or cur.received != hdr.offset:
                raise ProtocolError(f"frame of message {hdr.msg:#x} at offset {hdr.offset} while "
                                    f"{cur.msg:#x} is at {cur.received}", peer=peer.rank, rail=link.rail)
            if hdr.offset + hdr.length > cur.nbytes or hdr.arg != cur.nbytes:
                # the first frame matched the message's size: this is not a
                # disagreement of the ranks but a frame that lies
                raise ProtocolError(f"frame at offset {hdr.offset} with {hdr.length} bytes of a "
                                    f"{hdr.arg}-byte message, in one of {cur.nbytes} bytes",
                                    peer=peer.rank, rail=link.rail)
            link.binding = cur
            if isinstance(cur, Unexpected):
                link.sink = cur.buf[hdr.offset:hdr.offset + hdr.length]
            elif cur.reduce is not None:
                link.sink = link.staging_view(hdr.length)
            else:
                sink = cur.dst[hdr.offset:hdr.offset + hdr.length]
                host.protect_range(sink)
                link.sink = sink
        if link.parked:
            link.parked = False
            self._reading(link, True)
        link.sink_got = 0
        return True

    def _park(self, link: Link) -> bool:
        if self.stash and self._to_stash(link):
            return True
        if not link.parked:
            link.parked = True
            link.parked_at = time.monotonic()
            self._reading(link, False)
        return False

    def _to_stash(self, link: Link) -> bool:
        """Read the current frame into the stash instead of waiting."""
        hdr = link.hdr
        if self.stash_bytes + hdr.length > STASH_LIMIT or hdr.seq in self.stash:
            return False
        link.binding = _STASH
        link.sink = memoryview(bytearray(hdr.length))
        link.sink_got = 0
        if link.parked:
            link.parked = False
            self._reading(link, True)
        return True

    def stash_parked(self, now: float) -> None:
        """(timer) Links parked for longer than STASH_AFTER are read on into the stash."""
        for link in self.peer.links:
            if (link is not None and link.parked and link.hdr is not None
                    and now - link.parked_at >= STASH_AFTER):
                self._to_stash(link)

    def _reading(self, link: Link, reading: bool) -> None:
        self.peer.host.io.want(link, (POLLIN if reading else 0) | (POLLOUT if link.out else 0))

    def _match(self, hdr: Header):
        peer = self.peer
        if hdr.offset != 0:
            raise ProtocolError(f"message {hdr.msg:#x} starts at offset {hdr.offset}", peer=peer.rank)
        if hdr.msg & P2P_FLAG:
            queue = self.p2p_recvs.get(hdr.msg)
            anyq = peer.host.any_recvs.get(hdr.msg)
            if anyq and (not queue or anyq[0].op.seq < queue[0].op.seq):
                queue = anyq  # posted first: an any-source receive takes it
                anyq[0].peer = peer.rank
                anyq[0].op.source = peer.rank
                anyq[0].op.peers.add(peer.rank)
            if queue:
                m = queue.popleft()
                if m.nbytes != hdr.arg:
                    raise CollectiveMismatch(
                        f"recv of {m.nbytes} bytes from rank {peer.rank} matched a send of {hdr.arg} bytes",
                        peer=peer.rank, op_seq=m.op.seq)
                return m
            u = Unexpected(hdr.msg, hdr.sig, hdr.arg)
            self.unexpected.setdefault(hdr.msg, collections.deque()).append(u)
            return u
        host = peer.host
        if not self.coll_recvs or self.coll_recvs[0].msg > hdr.msg:
            if hdr.msg <= host.coll_started:
                raise CollectiveMismatch(
                    f"rank {peer.rank} sent data for collective #{hdr.msg}, in which rank {host.rank} expects "
                    f"nothing from it (different operation, root or group)", peer=peer.rank, op_seq=hdr.msg)
            return None
        m = self.coll_recvs[0]
        if m.msg != hdr.msg or m.sig != hdr.sig or m.nbytes != hdr.arg:
            raise CollectiveMismatch(_mismatch_text(host.rank, peer.rank, m, hdr), peer=peer.rank,
                                     op_seq=m.op.seq)
        self.coll_recvs.popleft()
        return m

    def deliver(self, link: Link) -> None:
        """The current frame is whole: apply it (once) and move on."""
        peer = self.peer
        host = peer.host
        hdr = link.hdr
        m = link.binding
        if m is _STASH:
            if hdr.seq >= peer.recv.expected and hdr.seq not in self.stash:
                self.stash[hdr.seq] = Stashed(hdr, link.sink)
                self.stash_bytes += hdr.length
            link.reset_read()
            self.apply_stash()
            return
        if m is not None and hdr.seq != peer.recv.expected:
            m = None  # another link delivered this frame first: a duplicate now
        if m is not None:
            self._applied(hdr, m, link.sink, link)
        link.reset_read()
        # A parked link may hold the next frame: the one that was ahead of
        # this one (failback: new frames on the primary while the backup
        # drains), or the start of a message that is posted now.
        self.resume_parked(skip=link)

    def _applied(self, hdr: Header, m, payload: memoryview, link: Optional[Link] = None) -> None:
        """Account a frame whose bytes are in place (or, for a reduction, in
        ``payload``): exactly once, in seq order."""
        peer = self.peer
        host = peer.host
        peer.recv.applied(hdr.seq)
        if hdr.flags & FLAG_ACK_NOW:
            peer.tx.ack_urgent = True  # the sender waits for it
        if isinstance(m, Unexpected):
            m.received += hdr.length
            if m.received == m.nbytes:
                m.done = True
                self.cur_in = None
                taker = self._taker(m.msg)
                if taker is not None:
                    self.unexpected[m.msg].remove(m)
                    self._take_unexpected(m, taker)
        else:
            if m.reduce is not None and hdr.length:
                m.reduce(hdr.offset, payload)
            m.received += hdr.length
            if m.on_frame is not None:
                m.on_frame(m.received)
            if m.received == m.nbytes:
                self.cur_in = None
                host.ops.recv_done(m)
        # A copy of this frame half-read on another (failing) link must
        # never land in memory that may be reused from now on.
        for other in peer.links:
            if (other is not None and other is not link and other.binding is not None
                    and other.hdr is not None and other.hdr.seq < peer.recv.expected):
                other.binding = None
                other.sink = host.discard(len(other.sink))

    def apply_stash(self) -> None:
        """Apply stashed frames that can be placed now, in seq order."""
        peer = self.peer
        host = peer.host
        stash = self.stash
        while stash:
            expected = peer.recv.expected
            for seq in [s for s in stash if s < expected]:  # delivered meanwhile over another link
                self.stash_bytes -= stash.pop(seq).hdr.length
            s = stash.get(expected)
            if s is None:
                return
            hdr = s.hdr
            cur = self.cur_in
            if cur is None:
                cur = self._match(hdr)
                if cur is None:
                    return  # its collective is not posted yet
                self.cur_in = cur
            elif cur.msg != hdr.msg or cur.received != hdr.offset:
                raise ProtocolError(f"stashed frame of message {hdr.msg:#x} at offset {hdr.offset} while "
                                    f"{cur.msg:#x} is at {cur.received}", peer=peer.rank)
            if hdr.offset + hdr.length > cur.nbytes or hdr.arg != cur.nbytes:
                raise ProtocolError(f"stashed frame at offset {hdr.offset} with {hdr.length} bytes of a "
                                    f"{hdr.arg}-byte message, in one of {cur.nbytes} bytes", peer=peer.rank)
            del stash[expected]
            self.stash_bytes -= hdr.length
            payload = s.payload
            if isinstance(cur, Unexpected):
                cur.buf[hdr.offset:hdr.offset + hdr.length] = payload
            elif cur.reduce is None and hdr.length:
                dst = cur.dst[hdr.offset:hdr.offset + hdr.length]
                host.protect_range(dst)
                dst[:] = payload
            self._applied(hdr, cur, payload)

    def resume_parked(self, skip: Optional[Link] = None) -> None:
        self.apply_stash()
        for link in list(self.peer.links):
            if link is not None and link.parked and link is not skip and link.hdr is not None:
                try:
                    if self.bind(link) and not len(link.sink):
                        self.deliver(link)  # nothing to read: no poll event would come
                    # otherwise reading resumes through poll
                except ProtocolError as exc:
                    self.peer.protocol_error(link, exc)


def _mismatch_text(rank: int, peer: int, m: InMessage, hdr: Header) -> str:
    if m.msg != hdr.msg:
        return (f"rank {peer} is at collective #{hdr.msg} while rank {rank} is at #{m.msg}: "
                f"the ranks called a different number or sequence of collectives")
    if m.sig != hdr.sig:
        return (f"collective #{m.msg} differs between rank {rank} and rank {peer} "
                f"(operation, dtype, reduce op, root or shape: signature {m.sig:#010x} vs {hdr.sig:#010x})")
    return f"collective #{m.msg}: rank {peer} sends {hdr.arg} bytes where rank {rank} expects {m.nbytes}"

