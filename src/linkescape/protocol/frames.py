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
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ..errors import ProtocolError

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


@dataclass(frozen=True)
class Header:
    kind: int
    flags: int
    seq: int
    ack: int
    msg: int
    offset: int
    length: int
    sig: int = 0
    arg: int = 0
    #: the sender's rails without carrier, a bitmask: level state that every
    #: frame repeats, so a lost notification cannot leave a rail marked down
    rails: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(self.kind, self.flags, self.rails, self.sig, self.seq, self.ack,
                           self.msg, self.offset, self.length, self.arg)


def pack_header(kind: int, seq: int, ack: int, msg: int = 0, offset: int = 0, length: int = 0,
                sig: int = 0, arg: int = 0, flags: int = 0, rails: int = 0) -> bytes:
    return HEADER.pack(kind, flags, rails, sig, seq, ack, msg, offset, length, arg)


def unpack_header(buf, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Header:
    """Decode and check one header: ProtocolError for a short buffer, an
    unknown kind, a control frame with a payload, or a payload larger than
    ``max_payload`` (the configured ``max_frame_bytes``), so no length field
    makes a reader allocate past that bound. Where a frame's seq, ack and
    offset belong is checked against the channel and the message (channel,
    engine), which know them."""
    if len(buf) < HEADER_SIZE:
        raise ProtocolError(f"short frame header: {len(buf)} bytes")
    kind, flags, rails, sig, seq, ack, msg, offset, length, arg = HEADER.unpack_from(buf)
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if kind != Kind.DATA and length:
        raise ProtocolError(f"control frame {Kind(kind).name} carries {length} payload bytes")
    if length > max_payload:
        raise ProtocolError(f"DATA frame of {length} bytes exceeds the bound of {max_payload} "
                            f"(LINKESCAPE_MAX_FRAME_BYTES)")
    return Header(kind, flags, seq, ack, msg, offset, length, sig, arg, rails)


_KINDS = frozenset(int(k) for k in Kind)

# The link handshake lives in .handshake; re-exported for older imports.
from .handshake import HELLO, HELLO_SIZE, MAGIC, VERSION, Hello  # noqa: E402,F401
