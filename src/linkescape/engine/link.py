"""One live TCP link to a peer on one rail: non-blocking framed I/O.

The link knows bytes and frames, not messages: its peer tells it where a
payload goes (``sink``) and what to do when it is whole.

Reads are buffered: one ``recv`` takes whatever the socket holds (up to
``READ_BUFFER`` bytes), and frames are cut from it, so a burst of small
frames costs one system call. A payload's remainder beyond the buffered
bytes is read straight into its destination when it is large (zero copy).
"""

from __future__ import annotations

import collections
import errno
import socket
from typing import Callable, Deque, Optional

from ..protocol.framemac import TAG_SIZE, FrameMac
from ..protocol.frames import (ACK, DEFAULT_MAX_PAYLOAD, HEADER_SIZE, HEARTBEAT, NOTIFY_DOWN, NOTIFY_SILENT,
                               NOTIFY_STALE, NOTIFY_UP, PEER_LOST, RELAY_RESET, RELAY_UNREACH, Header, pack_header,
                               unpack_header)

#: control frames that overtake queued data frames (see ``Link.queue_control``)
URGENT = frozenset((ACK, HEARTBEAT, NOTIFY_DOWN, NOTIFY_UP, NOTIFY_SILENT, NOTIFY_STALE, PEER_LOST, RELAY_UNREACH,
                    RELAY_RESET))
#: bytes of frames one ``flush`` seals under frame MACs, at most (then it returns as if the
#: socket were full: hashing is the CPU cost of a write there, ~1 ms per MiB)
MAC_FLUSH_BUDGET = 1 << 20
#: bytes one ``recv`` may take into the read buffer, at most (it starts at
#: FIRST_READ_BUFFER: a link that carries little holds little)
READ_BUFFER = 256 << 10
FIRST_READ_BUFFER = 4 << 10
#: the rest of a payload at least this long is read into its destination directly
DIRECT_READ = 64 << 10


class WireItem:
    """A frame queued on a link: its header bytes (two headers for a relayed
    frame) and, for a frame with a payload, what holds the payload (an
    OutFrame, whose payload may become a copy while queued: it is read at
    write time). ``on_sent`` runs once the whole item is written. On a link
    with frame MACs, ``tag`` is set when the item's turn to be written comes
    (its place on the link is then fixed)."""

    __slots__ = ("header", "frame", "pos", "total", "on_sent", "tag")

    def __init__(self, header: bytes, frame=None, on_sent: Optional[Callable[[], None]] = None) -> None:
        self.header = header
        self.frame = frame
        self.pos = 0
        self.total = len(header) + (frame.length if frame is not None else 0)
        self.on_sent = on_sent
        self.tag: Optional[bytes] = None

    def parts(self) -> list:
        """The item's bytes from ``pos`` on, as buffers."""
        bufs = [memoryview(self.header)]
        if self.frame is not None:
            bufs.append(self.frame.payload)
        if self.tag is not None:
            bufs.append(memoryview(self.tag))
        pos = self.pos
        while pos:
            n = len(bufs[0])
            if pos < n:
                bufs[0] = bufs[0][pos:]
                break
            pos -= n
            bufs.pop(0)
        return bufs


class LinkClosed(Exception):
    """The peer closed the connection (EOF)."""


class Link:
    __slots__ = ("sock", "fd", "peer", "rail", "epoch", "out", "out_bytes", "rbuf", "rview", "rpos", "rend",
                 "hdr", "sink", "sink_got", "parked", "staging", "last_sent", "bytes_sent", "bytes_received",
                 "binding", "pending_since", "silent_at", "grey", "parked_at", "frames_sent",
                 "frames_received", "open", "mac", "whole", "grey_sent")

    def __init__(self, sock: socket.socket, peer: int, rail: int, epoch: int, now: float,
                 mac_key=None):
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.rail = rail
        self.epoch = epoch
        #: False once the link left service (its peer dropped it)
        self.open = True
        self.out: Deque[WireItem] = collections.deque()
        self.out_bytes = 0
        self.rbuf: Optional[bytearray] = None
        self.rview: Optional[memoryview] = None
        self.rpos = 0
        self.rend = 0
        self.hdr: Optional[Header] = None
        self.sink: Optional[memoryview] = None
        self.sink_got = 0
        self.parked = False
        self.parked_at = 0.0
        self.staging: Optional[memoryview] = None
        #: when our bytes were first seen waiting for the peer's kernel ack
        self.pending_since: Optional[float] = None
        #: when the timers look at this link's silence next (bytes pending)
        self.silent_at = float("inf")
        self.last_sent = now
        self.bytes_sent = 0
        self.bytes_received = 0
        #: frames queued on this link and frames whose header was read (the idle-cost tests count them)
        self.frames_sent = 0
        self.frames_received = 0
        self.binding = None  # what the current payload is for (set by the receiver)
        self.grey = None  # its goodput watch (set by its peer)
        self.grey_sent = 0  # bytes_sent at its last goodput sample
        #: frame MACs (LINKESCAPE_FRAME_AUTH): every frame carries a tag, and
        #: is read whole (``whole``: header, payload, tag) before it is acted on;
        #: ``mac_key``: this side's ``handshake.FrameKeys`` (one key per direction)
        self.mac: Optional[FrameMac] = FrameMac(mac_key) if mac_key else None
        self.whole: Optional[memoryview] = None

    # ------------------------------------------------------------------ send
    def queue(self, item: WireItem) -> None:
        if self.mac is not None:
            item.total += TAG_SIZE
        self.out.append(item)
        self.out_bytes += item.total
        self.frames_sent += 1

    def queue_control(self, kind: int, ack: int, arg: int = 0, rails: int = 0, prefix: bytes = b"") -> None:
        """A control frame (after ``prefix``: the relay header of a frame of
        another pair). Acknowledgements, notifications and heartbeats go
        ahead of the data frames queued here (behind the frame being written
        and the control frames already ahead), so that they never wait for
        megabytes of replay or bulk data: the peer switches rails, releases
        memory and keeps its window open a round trip later. They carry level
        state (cumulative acks, rails words with a generation), which the
        receiver takes newest-first, so overtaking data is safe. ``BYE`` keeps
        its place: it must follow every data frame."""
        item = WireItem(prefix + pack_header(kind, 0, ack, arg=arg, rails=rails))
        out = self.out
        if kind in URGENT and out:
            n = len(out)
            i = 0
            # behind what is being written (or has its tag: its place is fixed) and the control frames ahead
            while i < n and (out[i].pos or out[i].tag is not None or out[i].frame is None):
                i += 1
            if self.mac is not None:
                item.total += TAG_SIZE
            out.insert(i, item)
            self.out_bytes += item.total
            self.frames_sent += 1
        else:
            self.queue(item)

    def flush(self) -> bool:
        """Write as much as the socket takes; True when the queue emptied.
        Raises OSError when the connection broke."""
        out = self.out
        sock = self.sock
        mac = self.mac
        sealed = 0
        while out:
            item = out[0]
            if mac is not None and item.tag is None:
                if sealed >= MAC_FLUSH_BUDGET:
                    # a replay of megabytes is hashed a budget at a time: the poll comes back for the
                    # rest (POLLOUT), and the other peers' notices and acks go out in between
                    return False
                item.tag = mac.seal(item.header, item.frame.payload) if item.frame is not None \
                    else mac.seal(item.header)
                sealed += item.total
            pos = item.pos
            if mac is not None:
                bufs = item.parts()
            else:
                hlen = len(item.header)
                if pos < hlen:
                    bufs = [memoryview(item.header)[pos:]]
                    if item.frame is not None:
                        bufs.append(item.frame.payload)
                else:
                    bufs = [item.frame.payload[pos - hlen:]]
            # Gather small following items into the same system call.
            if item.total - pos < 65536 and len(out) > 1:
                for i in range(1, min(len(out), 16)):
                    nxt = out[i]
                    if nxt.pos:
                        break
                    if mac is not None:
                        if nxt.total >= 65536 and nxt.tag is None:
                            # a frame sealed here has its place fixed: an acknowledgement or a
                            # notice queued later cannot overtake it, so only small ones go along
                            break
                        if nxt.tag is None:
                            nxt.tag = mac.seal(nxt.header, nxt.frame.payload) if nxt.frame is not None \
                                else mac.seal(nxt.header)
                        bufs += nxt.parts()
                        continue
                    bufs.append(nxt.header)
                    if nxt.frame is not None:
                        bufs.append(nxt.frame.payload)
            try:
                n = sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                return False
            self.bytes_sent += n
            self.out_bytes -= n
            while n and out:
                item = out[0]
                left = item.total - item.pos
                if n >= left:
                    n -= left
                    out.popleft()
                    if item.on_sent is not None:
                        item.on_sent()
                else:
                    item.pos += n
                    n = 0
        return True

    def discard_queue(self) -> None:
        """The link left service: what was queued will never be written."""
        out = self.out
        while out:
            item = out.popleft()
            if item.on_sent is not None:
                item.on_sent()
        self.out_bytes = 0

    # ------------------------------------------------------------------ recv
    def fill(self) -> bool:
        """One ``recv`` into the read buffer (what is kept of a frame moved
        to its start). True when the socket gave less than asked (drained
        for now). Raises LinkClosed on EOF, BlockingIOError when nothing was
        there. The buffer starts small (an idle link holds little) and grows
        while reads fill it."""
        rbuf = self.rbuf
        if rbuf is None:
            rbuf = self.rbuf = bytearray(FIRST_READ_BUFFER)
            self.rview = memoryview(rbuf)
        pos, end = self.rpos, self.rend
        if pos:
            if pos < end:
                rbuf[:end - pos] = bytes(self.rview[pos:end])  # (the ranges may overlap)
            end -= pos
            self.rpos = 0
            self.rend = end  # (the recv below may raise: the buffer must be consistent)
        size = len(rbuf)
        space = size - end
        if space < HEADER_SIZE:  # (a frame's rest longer than the buffer is being cut: grow)
            rbuf = self._grow(end, size * 2)
            size *= 2
            space = size - end
        n = self.sock.recv_into(self.rview[end:], space)
        if n == 0:
            self.rend = end
            raise LinkClosed()
        self.rend = end + n
        self.bytes_received += n
        if n < space:
            return True
        if size < READ_BUFFER:  # the socket held more than fits: read more at once from now on
            self._grow(end + n, min(size * 4, READ_BUFFER))
        return False

    def _grow(self, keep: int, size: int) -> bytearray:
        grown = bytearray(size)
        grown[:keep] = self.rview[:keep]
        self.rbuf = grown
        self.rview = memoryview(grown)
        return grown

    @property
    def buffered(self) -> int:
        return self.rend - self.rpos

    def take_header(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Optional[Header]:
        """The next header from the read buffer (checked: ProtocolError for
        nonsense), or None when fewer than a header's bytes are buffered."""
        pos = self.rpos
        if self.rend - pos < HEADER_SIZE:
            return None
        hdr = unpack_header(self.rbuf, max_payload, pos)
        self.rpos = pos + HEADER_SIZE
        self.frames_received += 1
        return hdr

    def take_payload(self) -> Optional[bool]:
        """Move the current payload toward ``sink``: buffered bytes first,
        then, for a large rest, straight from the socket. True when whole;
        False when more must come from the socket (the caller fills); None
        when a direct read drained the socket."""
        sink = self.sink
        got = self.sink_got
        need = len(sink) - got
        have = self.rend - self.rpos
        if have:
            n = need if have >= need else have
            pos = self.rpos
            sink[got:got + n] = self.rview[pos:pos + n]
            self.rpos = pos + n
            got += n
            self.sink_got = got
            if n == need:
                return True
            need -= n
        if need < DIRECT_READ:
            return False
        n = self.sock.recv_into(sink[got:], need)
        if n == 0:
            raise LinkClosed()
        self.bytes_received += n
        self.sink_got = got + n
        if n == need:
            return True
        return None

    def staging_view(self, nbytes: int) -> memoryview:
        if self.staging is None or len(self.staging) < nbytes:
            self.staging = memoryview(bytearray(max(nbytes, 1 << 16)))
        return self.staging[:nbytes]

    def reset_read(self) -> None:
        self.hdr = None
        self.sink = None
        self.sink_got = 0
        self.binding = None

    def close(self) -> None:
        self.open = False
        try:
            self.sock.close()
        except OSError:
            pass


def is_disconnect(exc: BaseException) -> bool:
    if isinstance(exc, LinkClosed):
        return True
    return isinstance(exc, OSError) and exc.errno in (
        errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
        errno.ENETDOWN, errno.ECONNABORTED, errno.ENOTCONN, errno.EBADF)
