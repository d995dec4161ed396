"""One live TCP link to a peer on one rail: non-blocking framed I/O.

The link knows bytes and frames, not messages: the engine tells it where a
payload goes (``sink``) and what to do when it is whole.
"""

from __future__ import annotations

import collections
import errno
import socket
from typing import Deque, Optional

from ..protocol.frames import DEFAULT_MAX_PAYLOAD, HEADER_SIZE, Header, Kind, pack_header, unpack_header
from ..protocol.linkstate import LinkStatus

_WOULD_BLOCK = (BlockingIOError, InterruptedError)

#: control frames that overtake queued data frames (see ``Link.queue_control``)
URGENT = frozenset((Kind.ACK, Kind.HEARTBEAT, Kind.NOTIFY_DOWN, Kind.NOTIFY_UP, Kind.NOTIFY_SILENT,
                    Kind.PEER_LOST))


class WireItem:
    """A frame queued on a link. DATA frames point at their OutFrame so that a
    payload turned into a copy (materialized) is read from the copy."""

    __slots__ = ("header", "frame", "pos", "total")

    def __init__(self, header: bytes, frame=None) -> None:
        self.header = header
        self.frame = frame
        self.pos = 0
        self.total = HEADER_SIZE + (frame.length if frame is not None else 0)


class LinkClosed(Exception):
    """The peer closed the connection (EOF)."""


class Link:
    __slots__ = ("sock", "fd", "peer", "rail", "epoch", "status", "out", "out_bytes",
                 "hdr_buf", "hdr_view", "hdr_got", "hdr", "sink", "sink_got", "parked",
                 "staging", "last_sent", "bytes_sent", "bytes_received", "binding", "pending_since", "silent_at", "grey",
                 "parked_at", "frames_sent", "frames_received")

    def __init__(self, sock: socket.socket, peer: int, rail: int, epoch: int, status: LinkStatus, now: float):
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.rail = rail
        self.epoch = epoch
        self.status = status
        self.out: Deque[WireItem] = collections.deque()
        self.out_bytes = 0
        self.hdr_buf = bytearray(HEADER_SIZE)
        self.hdr_view = memoryview(self.hdr_buf)
        self.hdr_got = 0
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
        self.binding = None  # what the current payload is for (set by the engine)
        self.grey = None  # its goodput watch (set by the engine)

    # ------------------------------------------------------------------ send
    def queue(self, item: WireItem) -> None:
        self.out.append(item)
        self.out_bytes += item.total
        self.frames_sent += 1

    def queue_control(self, kind: int, ack: int, arg: int = 0, rails: int = 0) -> None:
        """A control frame. Acknowledgements, notifications and heartbeats go
        ahead of the data frames queued here (behind the frame being written
        and the control frames already ahead), so that they never wait for
        megabytes of replay or bulk data: the peer switches rails, releases
        memory and keeps its window open a round trip later. They carry level
        state (cumulative acks, rails words with a generation), which the
        receiver takes newest-first, so overtaking data is safe. ``BYE`` keeps
        its place: it must follow every data frame."""
        item = WireItem(pack_header(kind, 0, ack, arg=arg, rails=rails))
        out = self.out
        if kind in URGENT and out:
            i = 1 if out[0].pos else 0
            n = len(out)
            while i < n and out[i].frame is None:
                i += 1
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
        while out:
            item = out[0]
            pos = item.pos
            if pos < HEADER_SIZE:
                bufs = [memoryview(item.header)[pos:]]
                if item.frame is not None:
                    bufs.append(item.frame.payload)
            else:
                bufs = [item.frame.payload[pos - HEADER_SIZE:]]
            # Gather small following items into the same system call.
            if item.total - pos < 65536 and len(out) > 1:
                for nxt in list(out)[1:16]:
                    if nxt.pos:
                        break
                    bufs.append(memoryview(nxt.header))
                    if nxt.frame is not None:
                        bufs.append(nxt.frame.payload)
            try:
                n = sock.sendmsg(bufs)
            except _WOULD_BLOCK:
                return False
            self.bytes_sent += n
            self.out_bytes -= n
            while n and out:
                item = out[0]
                left = item.total - item.pos
                if n >= left:
                    n -= left
                    out.popleft()
                else:
                    item.pos += n
                    n = 0
        return True

    # ------------------------------------------------------------------ recv
    def read_header(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Optional[Header]:
        """Read toward the next header; returns it when whole (checked:
        ProtocolError for nonsense, a payload beyond ``max_payload`` too)."""
        got = self.hdr_got
        n = self.sock.recv_into(self.hdr_view[got:], HEADER_SIZE - got)
        if n == 0:
            raise LinkClosed()
        self.bytes_received += n
        got += n
        self.hdr_got = got
        if got < HEADER_SIZE:
            return None
        self.hdr_got = 0
        self.frames_received += 1
        return unpack_header(self.hdr_buf, max_payload)

    def read_payload(self) -> bool:
        """Read toward the end of the current payload; True when whole."""
        sink = self.sink
        got = self.sink_got
        n = self.sock.recv_into(sink[got:])
        if n == 0:
            raise LinkClosed()
        self.bytes_received += n
        got += n
        self.sink_got = got
        return got == len(sink)

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
