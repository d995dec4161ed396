"""Wire format: the fixed frame header and the link handshake.

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

from ..errors import HandshakeError, ProtocolError

HEADER = struct.Struct("<BBHIQQQQII")
HEADER_SIZE = HEADER.size  # 48
assert HEADER_SIZE == 48

#: the top bit of ``msg`` marks point-to-point messages (the rest is the tag);
#: collective messages carry the operation's sequence number.
P2P_FLAG = 1 << 63
MAX_FRAME = (1 << 32) - 1
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

    def pack(self) -> bytes:
        return HEADER.pack(self.kind, self.flags, 0, self.sig, self.seq, self.ack,
                           self.msg, self.offset, self.length, self.arg)


def pack_header(kind: int, seq: int, ack: int, msg: int = 0, offset: int = 0, length: int = 0,
                sig: int = 0, arg: int = 0, flags: int = 0) -> bytes:
    return HEADER.pack(kind, flags, 0, sig, seq, ack, msg, offset, length, arg)


def unpack_header(buf) -> Header:
    kind, flags, _pad, sig, seq, ack, msg, offset, length, arg = HEADER.unpack_from(buf)
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if kind != Kind.DATA and length:
        raise ProtocolError(f"control frame {Kind(kind).name} carries {length} payload bytes")
    return Header(kind, flags, seq, ack, msg, offset, length, sig, arg)


_KINDS = frozenset(int(k) for k in Kind)

# ------------------------------------------------------------------ handshake
MAGIC = 0x4C4E4B45  # "LNKE"
VERSION = 1
HELLO = struct.Struct("<IHHIIIIQ32s")
HELLO_SIZE = HELLO.size


@dataclass(frozen=True)
class Hello:
    """The first bytes on every link, in both directions.

    The connecting side sends its Hello; the accepting side checks it and
    answers with its own. ``job`` ties the link to one communicator (a random
    token published in the store), ``epoch`` counts the times this link was
    (re)opened so a stale connection cannot be mistaken for the current one.
    ``expected`` is the next DATA seq the sender of the Hello expects from the
    other side: replay after a reconnect starts there.
    """

    src: int
    dst: int
    rail: int
    epoch: int
    expected: int
    job: bytes
    version: int = VERSION

    def pack(self) -> bytes:
        return HELLO.pack(MAGIC, self.version, 0, self.src, self.dst, self.rail, self.epoch,
                          self.expected, self.job.ljust(32, b"\0")[:32])

    @classmethod
    def unpack(cls, buf) -> "Hello":
        if len(buf) != HELLO_SIZE:
            raise HandshakeError(f"short handshake: {len(buf)} bytes")
        magic, version, _pad, src, dst, rail, epoch, expected, job = HELLO.unpack(buf)
        if magic != MAGIC:
            raise HandshakeError(f"bad magic {magic:#x}: not a linkescape peer")
        if version != VERSION:
            raise HandshakeError(f"protocol version {version} is not {VERSION}")
        return cls(src, dst, rail, epoch, expected, job.rstrip(b"\0"), version)

    def check(self, *, job: bytes, dst: int, world_size: int, rails: int) -> None:
        if self.job != job.rstrip(b"\0")[:32]:
            raise HandshakeError("handshake from another job")
        if self.dst != dst:
            raise HandshakeError(f"handshake addressed to rank {self.dst}, this is rank {dst}")
        if not 0 <= self.src < world_size or self.src == dst:
            raise HandshakeError(f"handshake from invalid rank {self.src}")
        if not 0 <= self.rail < rails:
            raise HandshakeError(f"handshake on invalid rail {self.rail}")
