"""Wire format: the fixed frame header (the link handshake: .handshake).

Rules:
- Every frame starts with a fixed 48-byte little-endian header.
- ``seq`` numbers the DATA frames of one direction of one peer channel, from 1,
  whatever link carries them. Control frames (ACK, HEARTBEAT, NOTIFY, BYE) carry
  seq 0 and are never replayed.
- ``ack`` is the cumulative acknowledgement of the reverse direction: every
  DATA frame with a seq <= ack was received whole and applied. Every frame
  carries one, so acks are never stuck behind data the receiver has not read.
- ``msg`` identifies the message a DATA frame belongs to; ``offset`` is the byte
  offset of its payload inside that message; ``sig`` is the signature of the
  operation that sent it, to catch ranks that disagree.
- A RELAY frame carries one whole frame of another pair (its header and
  payload) over one hop through a third rank; the pair's own ``seq`` and
  ``ack`` travel inside it untouched, so they stay end to end.
"""

from __future__ import annotations

import enum
import struct

from ..common.errors import ProtocolError

HEADER = struct.Struct("<BBHIQQQQII")
HEADER_SIZE = HEADER.size  # 48
assert HEADER_SIZE == 48

#: the top bit of ``msg`` marks point-to-point messages (the rest is the tag);
#: collective messages carry the operation's sequence number.
P2P_FLAG = 1 << 63
MAX_FRAME = (1 << 32) - 1
#: the payload bound of ``unpack_header`` unless the caller passes the
#: configured one (``Config.max_frame_bytes``, same default)
DEFAULT_MAX_PAYLOAD = 64 << 20
#: header flag: the sender waits for this frame's ack (zero-copy memory, or an
#: operation that completes on delivery), so acknowledge it at once
FLAG_ACK_NOW = 1
#: RELAY frame flag: the relay passed this frame on (``arg`` is its source);
#: without it the frame is to be passed on (``arg`` is its destination)
FLAG_PASSED = 2
#: bytes before the pair's frame inside a RELAY frame: its end-to-end MAC (protocol/relaymac.py)
RELAY_TRAILER = 32


class Kind(enum.IntEnum):
    DATA = 1
    ACK = 2
    HEARTBEAT = 3
    #: "my NIC on rail <arg> lost carrier": sent over a surviving link
    NOTIFY_DOWN = 4
    NOTIFY_UP = 5
    #: graceful close: the peer closes its communicator
    BYE = 6
    #: "I found our link on rail <arg> silent": switch now, do not wait to find it too
    NOTIFY_SILENT = 7
    #: "rank <arg> is lost": fail with it as the root cause (repeated while links remain)
    PEER_LOST = 8
    #: a whole frame of another pair, passed on by a third rank: the payload is
    #: that frame (its header and payload); ``arg`` is the rank at the other
    #: end (the destination on the way to the relay, the source after it)
    RELAY = 9
    #: (relay) "I cannot pass your frames on to rank <arg>"
    RELAY_UNREACH = 10
    #: (relay) "frames I was passing on to rank <arg> were lost: send again"
    RELAY_RESET = 11
    #: (the accepting, lower rank of a pair) "I have no link with you on rail
    #: <arg & 0xFF>: the one of epoch <arg >> 8> or older that you may still
    #: hold is gone; re-dial". Told again whenever a link comes up or a NIC is
    #: back while that is so: it may have closed its end while no frame could
    #: reach the dialer (its NIC without carrier)
    NOTIFY_STALE = 12


# plain ints for the data path (comparing IntEnum members costs more)
DATA, ACK, HEARTBEAT, NOTIFY_DOWN, NOTIFY_UP, BYE, NOTIFY_SILENT, PEER_LOST, RELAY, RELAY_UNREACH, \
    RELAY_RESET, NOTIFY_STALE = (int(k) for k in Kind)


class Header:
    """One decoded frame header (see the module's rules)."""

    __slots__ = ("kind", "flags", "seq", "ack", "msg", "offset", "length", "sig", "arg", "rails")

    def __init__(self, kind: int, flags: int, seq: int, ack: int, msg: int, offset: int, length: int,
                 sig: int = 0, arg: int = 0, rails: int = 0) -> None:
        self.kind = kind
        self.flags = flags
        self.seq = seq
        self.ack = ack
        self.msg = msg
        self.offset = offset
        self.length = length
        self.sig = sig
        self.arg = arg
        #: the sender's rails without carrier, a bitmask: level state that every
        #: frame repeats, so a lost notification cannot leave a rail marked down
        self.rails = rails

    def pack(self) -> bytes:
        return HEADER.pack(self.kind, self.flags, self.rails, self.sig, self.seq, self.ack,
                           self.msg, self.offset, self.length, self.arg)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Header) and self.pack() == other.pack()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Header(kind={self.kind}, seq={self.seq}, ack={self.ack}, msg={self.msg:#x}, "
                f"offset={self.offset}, length={self.length}, arg={self.arg})")


def pack_header(kind: int, seq: int, ack: int, msg: int = 0, offset: int = 0, length: int = 0,
                sig: int = 0, arg: int = 0, flags: int = 0, rails: int = 0) -> bytes:
    return HEADER.pack(kind, flags, rails, sig, seq, ack, msg, offset, length, arg)


_unpack_from = HEADER.unpack_from


def unpack_header(buf, max_payload: int = DEFAULT_MAX_PAYLOAD, pos: int = 0) -> Header:
    """Decode and check one header (at ``pos`` of ``buf``): ProtocolError for
    a short buffer, an unknown kind, a control frame with a payload, or a
    payload larger than ``max_payload`` (the configured ``max_frame_bytes``;
    a RELAY frame carries a whole frame: its header more), so no length
    field makes a reader allocate past that bound, or a DATA frame whose
    payload does not fit its own message (``offset + length > arg``). Where a frame's seq, ack
    and offset belong is checked against the channel and the message
    (channel, engine), which know them."""
    if len(buf) - pos < HEADER_SIZE:
        raise ProtocolError(f"short frame header: {len(buf) - pos} bytes")
    kind, flags, rails, sig, seq, ack, msg, offset, length, arg = _unpack_from(buf, pos)
    if length:
        if kind == DATA:
            if length > max_payload:
                raise ProtocolError(f"DATA frame of {length} bytes exceeds the bound of {max_payload} "
                                    f"(LINKESCAPE_MAX_FRAME_BYTES)")
        elif kind == RELAY:  # (its end-to-end MAC, then a whole frame)
            least, most = RELAY_TRAILER + HEADER_SIZE, RELAY_TRAILER + HEADER_SIZE + max_payload
            if length > most or length < least:
                raise ProtocolError(f"RELAY frame of {length} bytes: a relayed frame is {least} to "
                                    f"{most} bytes (LINKESCAPE_MAX_FRAME_BYTES)")
        elif kind in _KINDS:
            raise ProtocolError(f"control frame {Kind(kind).name} carries {length} payload bytes")
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if kind == RELAY and not length:
        raise ProtocolError("RELAY frame without a frame in it")
    if kind == DATA and offset + length > arg:  # (``arg``: the message's size, in every DATA frame)
        # a frame that does not fit its own message: it lies (issue 48), whichever frame of the
        # message it is; the first one is matched by ``arg`` alone, so nothing later would catch it
        raise ProtocolError(f"DATA frame at offset {offset} with {length} bytes of a {arg}-byte message")
    return Header(kind, flags, seq, ack, msg, offset, length, sig, arg, rails)


_KINDS = frozenset(int(k) for k in Kind)

# The link handshake lives in .handshake; re-exported for older imports.
from .handshake import HELLO, HELLO_SIZE, MAGIC, VERSION, Hello  # noqa: E402,F401
