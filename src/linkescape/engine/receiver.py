"""The inbound half of a peer: frames from its links (or relayed through a
third rank) into posted receives, in seq order and exactly once, whatever
path carried them.

- A frame is bound to where its payload goes (the caller's memory, a staging
  buffer for a reduction, an unexpected point-to-point buffer, or a discard
  buffer for a duplicate) before its payload is read.
- A link whose next frame cannot be placed yet (ahead of a gap another path
  will fill, or of a collective not posted yet) is *parked*: not read until
  the frame can be placed, so the frame lands in place without a copy.
  Parking leaves the poll's interest as it is: only when the poll finds more
  bytes on a parked link is its read interest turned off. The frame of a
  peer one collective ahead mostly came whole with the one before it, and
  nothing follows it until the next collective is posted: turning the
  interest off and on again for it was two system calls per link and
  collective (a third of a 4 B all_reduce's calls at 4 ranks).
- A link is never parked for long, though: what follows the frame (acks,
  notifications, rail state) must get through. After ``STASH_AFTER`` the
  frame is read into a buffer (the *stash*) and applied from there once it
  can be; while the stash holds anything, frames that cannot be placed go
  straight to it. A relayed frame arrives whole and goes there at once.
- Every allocation a frame's fields could size is bounded by configuration:
  the stash (bytes and frames) and the unexpected point-to-point messages
  (bytes and messages) of each peer. Past a bound the link stays parked
  (the sender waits) rather than the rank allocating.
- A reduction is applied only to a frame that arrived whole.
- The receiver never calls into its peer or the engine: it returns what it
  read. ``out`` holds, in the order read, what completed or failed
  (outcomes: ``RecvDone``, ``OpFailed``, a relay's ``Relayed``/``Forward``),
  what is for the pair's paths (``Heard``: a control frame, or a frame whose
  rail word changed) and ``RESEND`` (a relayed frame could not be kept: the
  peer must send again); two flags ask for an acknowledgement at once
  (``want_ack``) and for parked links to be tried again (``want_resume``).
  The shell (``PeerChannel``) takes them after every call and hands the
  ``Heard`` ones to ``PeerPaths``. A control frame, or a changed rail word,
  ends a read loop: what follows it on the link is read only once the shell
  applied it (a rail the peer says is down is not read on).
"""

from __future__ import annotations

import collections
import heapq
from typing import Deque, Dict, Iterator, List, NamedTuple, Optional

from ..common.errors import CollectiveMismatch, FrameAuthError, ProtocolError
from ..protocol.channel import AHEAD, DUPLICATE
from ..protocol.framemac import TAG_SIZE
from ..protocol.frames import DATA, FLAG_ACK_NOW, FLAG_PASSED, HEADER_SIZE, P2P_FLAG, RELAY, Header, unpack_header
from .io import POLLIN, POLLOUT
from .link import Link
from .messages import EPOCH_SHIFT, InMessage, discard, enqueue, pop_first
from .outcomes import Forward, OpFailed, Relayed, RecvDone

#: an acknowledgement owed goes with our next frame to the peer, or alone once owed this long
#: (the longest the peer's retransmit store holds small frames for want of it)
ACK_DELAY = 0.04
ACK_NET = 0.1


class Heard(NamedTuple):
    """A frame for the pair's paths: a control frame, or one whose rail word differs from the
    word applied; ``link``: the link it came on."""

    link: Link
    hdr: Header


#: in ``Receiver.out``: a relayed frame could not be kept, the peer must send again (RELAY_RESET)
RESEND = "resend"


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


class Dropped:
    """A message nobody will take: one of a group that was shrunk since (its frames are
    read, acknowledged and dropped), or the rest of one whose operation failed while it
    came in (the channel stays in step)."""

    __slots__ = ("msg", "sig", "nbytes", "received", "done")

    def __init__(self, msg: int, sig: int, nbytes: int, received: int = 0) -> None:
        self.msg = msg
        self.sig = sig
        self.nbytes = nbytes
        self.received = received
        self.done = False


#: a parked link is read on into the stash after this long
STASH_AFTER = 0.005
#: a gap the peer was asked to fill (a frame ahead of it dropped for want of room) is asked for again
#: after this long while frames ahead of it still come
GAP_ASK_AGAIN = 0.2
_STASH = object()  # the binding of a frame read into the stash
_RELAY = object()  # the binding of a RELAY frame (the whole inner frame is read)
#: what ``Receiver._stash`` did with a frame (0: no room, dropped)
KEPT, EVICTED = 1, 2


class Stashed:
    __slots__ = ("hdr", "payload")

    def __init__(self, hdr: Header, payload: memoryview) -> None:
        self.hdr = hdr
        self.payload = payload


class Receiver:
    def __init__(self, rank: int, env, links: List[Optional[Link]], inbound, outbound, paths) -> None:
        """``links`` is the peer's list of links (the same list: the shell keeps it), ``inbound``
        and ``outbound`` the pair's channels (protocol/channel.py), ``paths`` its PeerPaths, read
        only (the relay in use, the rail word applied)."""
        self.rank = rank
        self.env = env
        self.links = links
        self.inbound = inbound
        self.outbound = outbound
        self.paths = paths
        #: what was read, in order, for the shell to take (see the module's text)
        self.out: list = []
        #: an acknowledgement the peer waits for is owed (a duplicate, FLAG_ACK_NOW)
        self.want_ack = False
        #: a frame was applied: parked links may be able to go on
        self.want_resume = False
        #: when an acknowledgement owed (and not sent along with a frame) goes alone
        self.ack_due = 0.0
        #: the read loop met a frame for the paths: it ends after that frame
        self._stop = False
        #: when a link of this peer last had bytes for us (our clock): the peer was alive then (the
        #: store's liveness record it wrote last is at most a beat older: engine/beacon.py)
        self.heard = 0.0
        #: (the gap, when) the peer was last asked to send again a gap no link of ours could fill
        self._gap_asked = (0, -1.0)
        self.coll_recvs: Deque[InMessage] = collections.deque()
        self.p2p_recvs: Dict[int, Deque[InMessage]] = {}
        self.unexpected: Dict[int, Deque[Unexpected]] = {}
        self.unexpected_bytes = 0
        self.unexpected_count = 0
        #: the message whose frames are arriving now (frames of a message are contiguous)
        self.cur_in = None
        #: frames read before they could be placed, by seq (and their seqs, smallest first)
        self.stash: Dict[int, Stashed] = {}
        self._stash_seqs: List[int] = []
        self.stash_bytes = 0

    # ------------------------------------------------------------ posting
    def post(self, m: InMessage) -> None:
        if m.msg & P2P_FLAG:
            tag = m.msg
            queue = self._unclaimed(tag, m.sig)
            if queue and queue[0].done:
                self._take_unexpected(pop_first(self.unexpected, tag), m)
                return
            enqueue(self.p2p_recvs, tag, m)
        else:
            self.coll_recvs.append(m)

    def _claim(self, m: InMessage) -> InMessage:
        """An any-source receive is taken by this peer."""
        rank = self.rank
        m.peer = rank
        m.op.source = rank
        m.op.peers.add(rank)
        return m

    def _taker(self, tag: int):
        """The receive posted first for a whole unexpected message: this
        peer's own, or an any-source one."""
        queue = self.p2p_recvs.get(tag)
        anyq = self.env.matcher.any_recvs.get(tag)
        if anyq and (not queue or anyq[0].op.seq < queue[0].op.seq):
            return self._claim(pop_first(self.env.matcher.any_recvs, tag))
        return pop_first(self.p2p_recvs, tag) if queue else None

    def take_any(self, m: InMessage) -> bool:
        """An any-source receive being posted: take a whole unexpected
        message from this peer, if one waits."""
        queue = self._unclaimed(m.msg, m.sig)
        if queue and queue[0].done:
            self._take_unexpected(pop_first(self.unexpected, m.msg), self._claim(m))
            return True
        return False

    def _unclaimed(self, tag: int, sig: int):
        """The unexpected messages of ``tag``; whole ones of an older group (a shrink
        since: ``sig`` is the group's epoch) are dropped first."""
        queue = self.unexpected.get(tag)
        while queue and queue[0].done and queue[0].sig != sig:
            self._forget(pop_first(self.unexpected, tag))
            queue = self.unexpected.get(tag)
        return queue

    def _forget(self, u: Unexpected) -> None:
        """An unexpected message left ``self.unexpected``: its room is free again."""
        self.unexpected_bytes -= u.nbytes
        self.unexpected_count -= 1
        if not self.unexpected_count:
            self.env.matcher.holding.discard(self)

    def waiting(self) -> bool:
        """A receive is posted (or a message half in) from this peer."""
        return bool(self.coll_recvs) or self.cur_in is not None or any(self.p2p_recvs.values())

    def cancel(self, m: InMessage) -> None:
        """A failed operation's receive: unmatch it, and make sure no frame
        half-read for it lands in memory the caller gets back now."""
        if m in self.coll_recvs:
            self.coll_recvs.remove(m)
        if m.msg & P2P_FLAG:
            discard(self.p2p_recvs, m.msg, m)
        rest = None
        if self.cur_in is m:
            # its later frames still come, in order: read and dropped, not taken for another message's
            self.cur_in = rest = Dropped(m.msg, m.sig, m.nbytes, m.received) if m.received < m.nbytes else None
        for link in self.links:
            if link is not None and link.binding is m:
                link.binding = rest  # (the frame half-read is accounted, its bytes dropped)
                link.sink = self.env.discard(len(link.sink))

    def drop_stale(self, epoch: int) -> None:
        """The group was shrunk (``Matcher.new_epoch``): point-to-point messages of the old
        group that arrived unclaimed go, and one half in is read to its end and dropped."""
        for tag in [t for t, q in self.unexpected.items() if any(u.sig != epoch for u in q)]:
            for u in [u for u in self.unexpected[tag] if u.sig != epoch]:
                discard(self.unexpected, tag, u)
                self._forget(u)
        cur = self.cur_in
        if isinstance(cur, Unexpected) and cur.sig != epoch:
            self.cur_in = rest = Dropped(cur.msg, cur.sig, cur.nbytes, cur.received)
            for link in self.links:
                if link is not None and link.binding is cur:
                    link.binding = rest
                    link.sink = self.env.discard(len(link.sink))

    def _take_unexpected(self, u: Unexpected, m: InMessage) -> None:
        self._forget(u)
        if u.nbytes != m.nbytes:
            self.out.append(OpFailed(m.op, CollectiveMismatch(
                f"recv of {m.nbytes} bytes from rank {self.rank} matched a send of {u.nbytes} bytes",
                peer=self.rank, op_seq=m.op.seq)))
            return
        if m.nbytes:
            self.env.protect(m.dst)
            m.dst[:] = u.buf
        m.received = m.nbytes
        m.done = True
        self.out.append(RecvDone(m))

    # ------------------------------------------------------------ reading
    def on_readable(self, link: Link) -> None:
        """Read and apply frames until the socket has no more (or the link
        parks or goes down). Raises LinkEscapeError / OSError / BlockingIOError
        to the caller. One loop for both kinds of link: without frame MACs a
        header is acted on as soon as it is read and a DATA payload goes
        straight to where it belongs (``_header``, ``deliver``); with them
        (``link.mac``) each frame is read whole (header, payload, tag) and
        acted on only once its tag verified, so a forged frame changes nothing
        (it costs the link: a FrameAuthError) (``_sealed_room``, ``_verified``).

        True: it stopped after a frame for the paths (``Heard`` in ``out``);
        the caller applies it and, if the link is still open and not parked,
        calls again."""
        if link.parked:  # waiting for an earlier frame or a posted receive: stop looking (see _park)
            self._reading(link, False)
            return False
        self._stop = False
        self.heard = self.env.clock.now()
        sealed = link.mac is not None
        bound = self.env.config.max_frame_bytes
        drained = False
        while True:
            hdr = link.hdr
            if hdr is None:
                pos = link.rpos
                hdr = link.take_header(bound)
                if hdr is None:
                    if drained:
                        return False
                    drained = link.fill()
                    continue
                if sealed:
                    link.hdr = hdr
                    link.binding = bytes(link.rview[pos:pos + HEADER_SIZE])  # what the tag covers
                    go = self._sealed_room(link)
                else:
                    go = self._header(link, hdr)
                if not go:
                    return self._stop
            if link.sink_got < len(link.sink):
                got = link.take_payload()
                if got is not True:
                    if got is None or drained:
                        return False
                    drained = link.fill()
                    continue
            if sealed:
                self._verified(link)
            else:
                self.deliver(link)
            if self._stop or not link.open or link.parked:
                return self._stop

    def _header(self, link: Link, hdr) -> bool:
        """(no frame MACs) A header just read: its ack is applied; a control frame is for the paths
        (stop reading: False). True: its payload follows (bound); False: stop reading (parked)."""
        if hdr.ack:
            self.outbound.on_ack(hdr.ack)
        kind = hdr.kind
        if kind != DATA and kind != RELAY:
            self._hear(link, hdr)
            return False
        if hdr.rails != self.paths.peer_rails.word:
            self._hear(link, hdr)  # (the loop ends after this frame)
        link.hdr = hdr
        return self.bind(link)

    def _hear(self, link: Link, hdr: Header) -> None:
        self.out.append(Heard(link, hdr))
        self._stop = True

    # ------------------------------------------------------------ frames with MACs
    def _verified(self, link: Link) -> None:
        """(frame MACs) A frame read whole: acted on once its tag verified."""
        hdr, head, whole = link.hdr, link.binding, link.sink
        payload = whole[:hdr.length]
        if not link.mac.check(whole[hdr.length:], head, payload):
            raise FrameAuthError(f"frame {link.mac.received - 1} on the link fails its MAC (forged, altered or "
                                 f"out of place; LINKESCAPE_FRAME_AUTH must be the same on every rank)",
                                 peer=self.rank, rail=link.rail)
        link.reset_read()
        self._sealed_frame(link, hdr, payload)

    def _sealed_room(self, link: Link) -> bool:
        """May the current frame be read now (its payload kept until verified)?
        A frame that can only be kept (not placed) waits while the stash is
        full, as one for a relay whose window is full; False parks."""
        hdr = link.hdr
        if hdr.kind == RELAY and not hdr.flags & FLAG_PASSED:
            if not self.env.relay_admit(self.rank, hdr.arg, hdr.length):
                return self._park(link)
        elif hdr.kind == DATA and hdr.seq > self.inbound.expected:  # (the next one is always read: it fills gaps)
            if not self._stash_room(hdr.length):
                return self._park(link)
        n = hdr.length + TAG_SIZE
        if link.whole is None or len(link.whole) < n:
            link.whole = memoryview(bytearray(max(n, 1 << 12)))
        link.sink = link.whole[:n]
        link.sink_got = 0
        if link.parked:
            link.parked = False
            self._reading(link, True)
        return True

    def _sealed_frame(self, link: Link, hdr: Header, payload: memoryview) -> None:
        """A frame whose tag verified: act on it as on any frame (its payload
        is in the link's buffer: what is kept is copied)."""
        if hdr.ack:
            self.outbound.on_ack(hdr.ack)
        kind = hdr.kind
        if kind != DATA and kind != RELAY:
            self._hear(link, hdr)
            return
        if hdr.rails != self.paths.peer_rails.word:
            self._hear(link, hdr)  # (the loop ends after this frame)
        if kind == DATA:
            self._whole_data(hdr, payload, keep=True)
        else:
            frame = memoryview(bytearray(payload))
            self.out.append(Relayed(hdr.arg, frame, link) if hdr.flags & FLAG_PASSED else Forward(hdr.arg, frame))

    def _whole_data(self, hdr: Header, payload: memoryview, keep: bool) -> None:
        """A whole DATA frame of this peer: applied if it is next and its
        message is posted, else stashed (a copy when ``keep``: the buffer is
        reused), a duplicate acknowledged again."""
        if self.inbound.classify(hdr.seq) is DUPLICATE or hdr.seq in self.stash:
            self.inbound.ack_sent = 0
            self.want_ack = True
            return
        if hdr.seq == self.inbound.expected:
            # the next one is placed whatever the stash holds (later frames only: this one is not
            # there): it is what they wait for, and a full stash must never keep it out
            cur = self.cur_in
            if cur is None:
                cur = self._match(hdr)
                if cur is not None:
                    self.cur_in = cur
            else:
                cur = self._next(cur, hdr, None)
            if cur is not None:
                self._place(hdr, cur, payload)
                self.want_resume = True
                if self._stash_seqs:
                    self.apply_stash()
                return
        kept = self._stash(hdr, memoryview(bytes(payload)) if keep else payload, evict=True)
        if kept is not KEPT:
            self.out.append(RESEND)  # no room, or later frames made room for it: the sender must send again
            if not kept:
                return
        self.apply_stash()

    def bind(self, link: Link) -> bool:
        """Decide where the current frame's payload goes; False to park."""
        env = self.env
        hdr = link.hdr
        if hdr.kind == RELAY:
            if not hdr.flags & FLAG_PASSED and not env.relay_admit(self.rank, hdr.arg, hdr.length):
                return self._park(link)  # the relay's window for that pair is full
            link.binding = _RELAY
            link.sink = memoryview(bytearray(hdr.length))
            return self._bound(link)
        cls = self.inbound.classify(hdr.seq)
        if cls is not DUPLICATE and hdr.seq in self.stash:
            cls = DUPLICATE  # a replay of a frame we hold already
        if cls is DUPLICATE:
            # a replay of something we have: our ack may have died with a link
            link.binding = None
            link.sink = env.discard(hdr.length)
            self.inbound.ack_sent = 0
            self.want_ack = True
        elif cls is AHEAD:
            if self.stash and self._to_stash(link):
                return True  # it follows frames the stash holds
            if self.paths.relay is not None or any(other is not link and other.open for other in self.links if other):
                return self._park(link)  # the gap is on its way over another path (or the stash)
            # No other link of ours can fill the gap. Either the frames missing are replayed behind
            # this one on this very link (the sender lost the link they went on), or they went on a
            # link the sender has up and we do not have yet: its first connection, adopted by the
            # acceptor before the dialer read the answer (dropped here, this frame waited for a replay
            # that never came: a collective hung at start-up with connect_at_start=neighbours). Keep
            # it in the stash; a replayed copy is a duplicate.
            if self._to_stash(link):
                return True
            # No room: drop it, and ask the peer to send again what we have not acknowledged.
            link.binding = None
            link.sink = env.discard(hdr.length)
            self._ask_gap()
        else:
            cur = self.cur_in
            if cur is None:
                cur = self._match(hdr)
                if cur is None:
                    return self._park(link)
                self.cur_in = cur
            else:
                cur = self._next(cur, hdr, link.rail)
                if cur is None:
                    return self._park(link)
            link.binding = cur
            if isinstance(cur, Dropped):
                link.sink = env.discard(hdr.length)
            elif isinstance(cur, Unexpected):
                link.sink = cur.buf[hdr.offset:hdr.offset + hdr.length]
            elif cur.reduce is not None:
                link.sink = link.staging_view(hdr.length)
            else:
                sink = cur.dst[hdr.offset:hdr.offset + hdr.length]
                env.protect(sink)
                link.sink = sink
        return self._bound(link)

    def _bound(self, link: Link) -> bool:
        if link.parked:
            link.parked = False
            self._reading(link, True)
        link.sink_got = 0
        return True

    def _next(self, cur, hdr: Header, rail: Optional[int]):
        """The message the next frame (in seq order) belongs to while ``cur`` is half in: ``cur``,
        or, where the frame starts another message, what that one matches (None: it waits).

        The sender of a message whose operation failed drops the rest of it (``Sender.cancel``;
        the frames carved already stay in its replay window and still come, in order, before
        anything later). So a frame at offset 0 of another message proves that the rest of a
        message dropped here (``Dropped``: our side failed too) or not yet taken (``Unexpected``)
        never comes: it is given up, and the new message matched. While a receive of ours is half
        in, such a frame waits (parked or stashed): the sender's operation failed first (its
        deadline, its shrink); ours ends too (its deadline, our shrink), and the frame goes on."""
        if hdr.offset == 0 and (cur.msg != hdr.msg or cur.received):
            if isinstance(cur, (Dropped, Unexpected)):
                if isinstance(cur, Unexpected):
                    discard(self.unexpected, cur.msg, cur)
                    self._forget(cur)
                for link in self.links:  # (its frames are all in: only a duplicate may be bound)
                    if link is not None and link.binding is cur:
                        link.binding = None
                        link.sink = self.env.discard(len(link.sink))
                self.cur_in = None
                cur = self._match(hdr)
                if cur is not None:
                    self.cur_in = cur
                return cur
            return None
        self._check_next(cur, hdr, rail)
        return cur

    def _check_next(self, cur, hdr: Header, rail: Optional[int]) -> None:
        if cur.msg != hdr.msg or cur.received != hdr.offset:
            raise ProtocolError(f"frame of message {hdr.msg:#x} at offset {hdr.offset} while "
                                f"{cur.msg:#x} is at {cur.received}", peer=self.rank, rail=rail)
        if hdr.offset + hdr.length > cur.nbytes or hdr.arg != cur.nbytes:
            # the first frame matched the message's size: this is not a
            # disagreement of the ranks but a frame that lies
            raise ProtocolError(f"frame at offset {hdr.offset} with {hdr.length} bytes of a "
                                f"{hdr.arg}-byte message, in one of {cur.nbytes} bytes",
                                peer=self.rank, rail=rail)

    def _ask_gap(self) -> None:
        """A frame ahead of a gap was dropped: the peer sends everything unacknowledged again
        (``RESEND``); asked once per gap, and again after ``GAP_ASK_AGAIN`` if it is still open."""
        gap, at = self._gap_asked
        now = self.env.clock.now()
        if gap != self.inbound.expected or now - at >= GAP_ASK_AGAIN:
            self._gap_asked = (self.inbound.expected, now)
            self.out.append(RESEND)

    def _park(self, link: Link) -> bool:
        if self.stash and self._to_stash(link):
            return True
        if not link.parked:
            link.parked = True
            link.parked_at = now = self.env.clock.now()
            self.env.soon(now + STASH_AFTER)  # (stash_parked)
            # (read interest stays on until the poll finds more bytes here: on_readable turns it off)
        return False

    def _stash_room(self, nbytes: int) -> bool:
        limits = self.env.config
        return (self.stash_bytes + nbytes <= limits.max_stash_bytes
                and len(self.stash) < limits.max_stash_frames)

    def _to_stash(self, link: Link) -> bool:
        """Read the current frame into the stash instead of waiting."""
        hdr = link.hdr
        if hdr.kind != DATA or not self._stash_room(hdr.length) or hdr.seq in self.stash:
            return False
        link.binding = _STASH
        link.sink = memoryview(bytearray(hdr.length))
        link.sink_got = 0
        if link.parked:
            link.parked = False
            self._reading(link, True)
        return True

    def stash_parked(self, now: float, due: float) -> float:
        """(timer) Links parked for longer than STASH_AFTER are read on into the stash; returns when
        the next parked one will be (``due`` if none is sooner): nothing else wakes the timers for a
        parked frame while no operation is in flight."""
        for link in self.links:
            if link is not None and link.parked and link.hdr is not None and link.mac is None:
                at = link.parked_at + STASH_AFTER
                if now >= at:
                    self._to_stash(link)
                elif at < due:
                    due = at
        return due

    def _reading(self, link: Link, reading: bool) -> None:
        self.env.io.want(link, (POLLIN if reading else 0) | (POLLOUT if link.out else 0))

    def _match(self, hdr: Header):
        if hdr.offset != 0:
            raise ProtocolError(f"message {hdr.msg:#x} starts at offset {hdr.offset}", peer=self.rank)
        matcher = self.env.matcher
        if hdr.msg & P2P_FLAG:
            if hdr.sig != matcher.epoch:  # (the group's epoch: see Matcher)
                return Dropped(hdr.msg, hdr.sig, hdr.arg) if hdr.sig < matcher.epoch else None
            queues = self.p2p_recvs
            queue = queues.get(hdr.msg)
            anyq = matcher.any_recvs.get(hdr.msg)
            if anyq and (not queue or anyq[0].op.seq < queue[0].op.seq):
                queue, queues = anyq, matcher.any_recvs  # posted first: an any-source receive takes it
                self._claim(anyq[0])
            if queue:
                m = pop_first(queues, hdr.msg)
                if m.nbytes != hdr.arg:
                    raise CollectiveMismatch(
                        f"recv of {m.nbytes} bytes from rank {self.rank} matched a send of {hdr.arg} bytes",
                        peer=self.rank, op_seq=m.op.seq)
                return m
            limits = self.env.config
            if (self.unexpected_bytes + hdr.arg > limits.max_unexpected_bytes
                    or self.unexpected_count >= limits.max_unexpected):
                return None  # past the bound: the sender waits until a receive is posted
            u = Unexpected(hdr.msg, hdr.sig, hdr.arg)
            self.unexpected_bytes += hdr.arg
            self.unexpected_count += 1
            matcher.holding.add(self)  # (a shrink drops the old group's: Receiver.drop_stale)
            enqueue(self.unexpected, hdr.msg, u)
            return u
        if hdr.msg < matcher.floor:
            return Dropped(hdr.msg, hdr.sig, hdr.arg)  # a collective of the group before a shrink
        if hdr.msg >> EPOCH_SHIFT > matcher.epoch:
            return None  # the peer shrank the group already; this rank has not yet
        if not self.coll_recvs or self.coll_recvs[0].msg > hdr.msg:
            if hdr.msg in matcher.coll_failed:
                return Dropped(hdr.msg, hdr.sig, hdr.arg)  # a collective that failed here: the rest of it
            if hdr.msg <= matcher.coll_started:
                raise CollectiveMismatch(
                    f"rank {self.rank} sent data for collective #{hdr.msg}, in which rank {self.env.rank} "
                    f"expects nothing from it (different operation, root or group)", peer=self.rank,
                    op_seq=hdr.msg)
            return None
        m = self.coll_recvs[0]
        if m.msg != hdr.msg or m.sig != hdr.sig or m.nbytes != hdr.arg:
            raise CollectiveMismatch(_mismatch_text(self.env.rank, self.rank, m, hdr), peer=self.rank,
                                     op_seq=m.op.seq)
        self.coll_recvs.popleft()
        return m

    def deliver(self, link: Link) -> None:
        """The current frame is whole: apply it (once) and move on."""
        hdr = link.hdr
        m = link.binding
        if m is _RELAY:
            frame = link.sink
            link.reset_read()
            if hdr.flags & FLAG_PASSED:
                self.out.append(Relayed(hdr.arg, frame, link))
            else:
                self.out.append(Forward(hdr.arg, frame))
            return
        if m is _STASH:
            if self._stash(hdr, link.sink, evict=True) is not KEPT:
                # its room, free when its header was read, went to another frame meanwhile (a
                # relayed one, another link's): it took a later frame's, or was dropped; either
                # way the sender must send again
                self.out.append(RESEND)
            link.reset_read()
            self.apply_stash()
            return
        if m is not None and hdr.seq != self.inbound.expected:
            m = None  # another path delivered this frame first: a duplicate now
        if m is not None:
            self._applied(hdr, m, link.sink, link)
        link.reset_read()
        # A parked link may hold the next frame: the one that was ahead of
        # this one (failback: new frames on the primary while the backup
        # drains), or the start of a message that is posted now.
        if self.blocked():
            self.want_resume = True

    def blocked(self) -> bool:
        """Frames wait that a new receive or an applied frame may let in
        (the stash, a parked link)."""
        if self.stash:
            return True
        for link in self.links:
            if link is not None and link.parked:
                return True
        return False

    def _stash(self, hdr: Header, payload: memoryview, evict: bool = False) -> int:
        """Keep a frame until it can be placed: KEPT, or EVICTED when later frames were dropped
        to make room (the sender must send them again: the caller asks for that), or 0 (false)
        when there is no room. ``evict``: a frame may take the room of later frames. Without it,
        a stash full of frames that wait for this one would turn it away each time it came, for
        as long as the pair had no other path: the lowest frames are the ones the stash keeps."""
        if hdr.seq < self.inbound.expected or hdr.seq in self.stash:
            return KEPT
        kept = KEPT
        if not self._stash_room(hdr.length):
            if not evict or not self._evict_above(hdr.seq, hdr.length):
                return 0
            kept = EVICTED
        self.stash[hdr.seq] = Stashed(hdr, payload)
        heapq.heappush(self._stash_seqs, hdr.seq)
        self.stash_bytes += hdr.length
        self.env.soon(0.0)  # the timers keep a close eye on a peer with frames stashed
        return kept

    def _evict_above(self, seq: int, nbytes: int) -> bool:
        """Drop stashed frames above ``seq``, highest first, until one of ``nbytes`` fits; nothing
        is dropped (False) when even all of them would not make room. Rare (a stash at its
        bound): linear in what it holds."""
        limits = self.env.config
        later = sorted((s for s in self.stash if s > seq), reverse=True)
        free_bytes = limits.max_stash_bytes - self.stash_bytes
        free_frames = limits.max_stash_frames - len(self.stash)
        drop = []
        for s in later:
            if free_bytes >= nbytes and free_frames >= 1:
                break
            drop.append(s)
            free_bytes += self.stash[s].hdr.length
            free_frames += 1
        if free_bytes < nbytes or free_frames < 1:
            return False
        for s in drop:
            self.stash_bytes -= self.stash.pop(s).hdr.length
        gone = set(drop)
        self._stash_seqs[:] = [s for s in self._stash_seqs if s not in gone]  # (in place: one list)
        heapq.heapify(self._stash_seqs)
        return True

    def _applied(self, hdr: Header, m, payload: memoryview, link: Optional[Link] = None) -> None:
        """Account a frame whose bytes are in place (or, for a reduction, in
        ``payload``): exactly once, in seq order."""
        inbound = self.inbound
        if not inbound.ack_owed:
            # the first frame owing an ack: it goes with our next frame to the peer, or alone
            # from ACK_DELAY on, when the timers next run (they wake for it once they saw it
            # owed; the wake-up asked for here is a net, later: one this early would mostly find
            # the ack gone with a frame, and an earlier timer round replaces it)
            now = self.env.clock.now()
            self.ack_due = now + ACK_DELAY
            self.env.soon(now + ACK_NET)
        inbound.applied(hdr.seq)
        if hdr.flags & FLAG_ACK_NOW:
            self.want_ack = True  # the sender waits for it
        if isinstance(m, Dropped):
            m.received += hdr.length
            if m.received >= m.nbytes:
                m.done = True
                self.cur_in = None
        elif isinstance(m, Unexpected):
            m.received += hdr.length
            if m.received == m.nbytes:
                m.done = True
                self.cur_in = None
                taker = self._taker(m.msg)
                if taker is not None:
                    discard(self.unexpected, m.msg, m)
                    self._take_unexpected(m, taker)
        else:
            if m.reduce is not None and hdr.length:
                m.reduce(hdr.offset, payload)
            m.received += hdr.length
            if m.on_frame is not None:
                m.on_frame(m.received)
            if m.received == m.nbytes:
                self.cur_in = None
                m.done = True
                self.out.append(RecvDone(m))
        # A copy of this frame half-read on another (failing) link must
        # never land in memory that may be reused from now on. (Only DATA
        # frames of this channel: a RELAY frame half-read on the same link is
        # another pair's, its header carries no sequence number of ours, and
        # dropping it would lose that pair's frame.)
        expected = self.inbound.expected
        for other in self.links:
            if (other is not None and other is not link and other.mac is None and other.binding is not None
                    and other.hdr is not None and other.hdr.kind == DATA and other.hdr.seq < expected):
                other.binding = None
                other.sink = self.env.discard(len(other.sink))

    def on_relayed(self, frame: memoryview) -> None:
        """A whole DATA frame of this peer that a third rank passed on: apply
        it if it is next and its message is posted, else keep it in the
        stash (or drop a duplicate). Its header was read by the peer."""
        hdr = unpack_header(frame, self.env.config.max_frame_bytes)
        payload = frame[HEADER_SIZE:HEADER_SIZE + hdr.length]
        if len(payload) != hdr.length:
            raise ProtocolError(f"relayed frame of {len(frame)} bytes announces {hdr.length}", peer=self.rank)
        self._whole_data(hdr, payload, keep=False)

    def apply_stash(self) -> None:
        """Apply stashed frames that can be placed now, in seq order (each
        stashed frame is looked at a bounded number of times: linear)."""
        stash = self.stash
        seqs = self._stash_seqs
        while seqs:
            expected = self.inbound.expected
            while seqs and seqs[0] < expected:  # delivered meanwhile over another path
                s = stash.pop(heapq.heappop(seqs), None)
                if s is not None:
                    self.stash_bytes -= s.hdr.length
            if not seqs or seqs[0] != expected:
                return
            s = stash[expected]
            hdr = s.hdr
            cur = self.cur_in
            if cur is None:
                cur = self._match(hdr)
                if cur is None:
                    return  # its message is not posted yet (or past the unexpected bound)
                self.cur_in = cur
            else:
                cur = self._next(cur, hdr, None)
                if cur is None:
                    return
            heapq.heappop(seqs)
            del stash[expected]
            self.stash_bytes -= hdr.length
            self._place(hdr, cur, s.payload)

    def _place(self, hdr: Header, cur, payload: memoryview) -> None:
        """A whole frame's payload into its message (copied, or reduced) and accounted."""
        if isinstance(cur, Dropped):
            pass
        elif isinstance(cur, Unexpected):
            cur.buf[hdr.offset:hdr.offset + hdr.length] = payload
        elif cur.reduce is None and hdr.length:
            dst = cur.dst[hdr.offset:hdr.offset + hdr.length]
            self.env.protect(dst)
            dst[:] = payload
        self._applied(hdr, cur, payload)

    def resume_parked(self) -> Iterator[Link]:
        """Frames that could not be placed may fit now: apply the stash,
        then bind the parked links' frames, one at a time: each link bound
        is yielded for the caller to read on at once (what its buffer holds;
        the rest comes through poll), before the next one is bound."""
        self.apply_stash()
        for link in list(self.links):
            if link is not None and link.parked and link.hdr is not None:
                if self._sealed_room(link) if link.mac is not None else self.bind(link):
                    yield link


def _mismatch_text(rank: int, other: int, m: InMessage, hdr: Header) -> str:
    if m.msg != hdr.msg:
        return (f"rank {other} is at collective #{hdr.msg} while rank {rank} is at #{m.msg}: "
                f"the ranks called a different number or sequence of collectives")
    if m.sig != hdr.sig:
        return (f"collective #{m.msg} differs between rank {rank} and rank {other} "
                f"(operation, dtype, reduce op, root or shape: signature {m.sig:#010x} vs {hdr.sig:#010x})")
    return f"collective #{m.msg}: rank {other} sends {hdr.arg} bytes where rank {rank} expects {m.nbytes}"
