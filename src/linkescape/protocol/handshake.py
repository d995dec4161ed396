"""The link handshake: mutual challenge-response over the job's key (sans-I/O).

Rules:
- The dialing side (the higher rank of the pair) speaks first. The accepting
  side proves nothing and tells nothing about the link (epoch, expected seq)
  before the dialer has proved that it holds the key::

      dialer   HELLO      magic, version, src, dst, rail, epoch, expected, job, nonce_d, mac_h
      acceptor CHALLENGE  nonce_a                      (fresh random, says nothing)
      dialer   PROOF      mac_d
      acceptor ACCEPT     epoch, expected, mac_a       (only after mac_d checked)
           or  REJECT     reason, mac_r                (and the connection closes)

- ``mac_d = HMAC-SHA256(key, "dial" | job | nonce_d | nonce_a | src | dst | rail
  | epoch | expected_d)`` and ``mac_a`` the same with the label "accept" and the
  acceptor's expected. Distinct labels: a proof cannot be reflected back. Both
  nonces are fresh: a handshake recorded on an earlier connection fails on a
  new one. The key never crosses the wire; proofs compare in constant time.
- ``mac_h`` (label "hello", no ``nonce_a``) shows at once that the dialer
  holds the key: a HELLO without it is rejected on arrival, so a stranger
  who knows the job from the store never holds a handshake slot past its
  HELLO, and a genuine dial waiting for its proof can be told from it (the
  acceptor evicts what has not shown the key first). It is replayable, so it
  only orders the slots: the link itself still needs ``mac_d`` over ``nonce_a``.
- ``mac_r = HMAC-SHA256(key, "reject" | reason | job | nonce_d | src | dst |
  rail | epoch | expected_d)``: a REJECT the dialer can verify came from
  a holder of its key. One that does not verify is a forged REJECT or an
  acceptor with another key, and the dialer cannot tell which
  (``UnverifiedReject``, "rejected (unverified)").
- Once established, both sides hold two keys of this link alone, one per
  direction (``link_keys``: HKDF-SHA256, RFC 5869, as WireGuard and TLS derive
  theirs): extract with both nonces as the salt and the job's key as the
  input, expand with a label that names the direction (dialer to acceptor,
  acceptor to dialer), the job, both ranks, the rail and the epoch. What
  ``LINKESCAPE_FRAME_AUTH`` MACs every frame with: a frame sent back to its
  sender (reflected), replayed on a re-dial (fresh nonces) or moved to
  another link (other nonces, rail, ranks) fails its MAC.
- Every message has a fixed size and starts with magic, version and type: a
  decoder never holds more than one message (the largest is ``HELLO_SIZE``),
  whatever the bytes say, and asks for exactly the bytes it needs (``want``),
  so it never reads into the frames that follow the handshake.
- Time comes in as an argument: past its deadline a handshake fails.
- A message that is malformed, out of order or late is a ``HandshakeError``;
  a proof (or a HELLO's ``mac_h``) that does not verify is an ``AuthError``,
  a REJECT whose ``mac_r`` does not verify an ``UnverifiedReject`` (an
  ``AuthError``), a dial refused as mis-routed a ``RailMismatch``. Nothing
  else escapes.
"""

from __future__ import annotations

import enum
import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from ..common.errors import AuthError, HandshakeError, RailMismatch, UnverifiedReject

MAGIC = 0x4C4E4B45  # "LNKE"
#: 5: relayed frames carry a counter (their trailer: 32 bytes); 4: frame keys per
#: direction (HKDF); 3: the HELLO carries mac_h and the REJECT mac_r (2:
#: challenge-response; 1 was a plain Hello answered with a Hello)
VERSION = 5
NONCE_SIZE = 32
MAC_SIZE = 32
JOB_SIZE = 32


class Msg(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    PROOF = 3
    ACCEPT = 4
    REJECT = 5


class Reject(enum.IntEnum):
    """Why an acceptor closed a handshake (sent in REJECT; reveals nothing)."""

    #: the dialer's proof does not verify: another key, or no key
    BAD_PROOF = 1
    #: authenticated, but not wanted now (stale epoch, rail down here)
    REFUSED = 2
    #: HELLO for another job, rank or rail
    BAD_HELLO = 3
    #: the dial arrived on another rail's listener, or from an address that
    #: is not the claimed rank's address on that rail
    BAD_ROUTE = 4


PREFIX = struct.Struct("<IHH")  # magic, version, type
HELLO = struct.Struct("<IHHIIIIQ32s32s32s")
CHALLENGE = struct.Struct("<IHH32s")
PROOF = struct.Struct("<IHH32s")
ACCEPT = struct.Struct("<IHHIQ32s")
REJECT = struct.Struct("<IHHI32s")
HELLO_SIZE = HELLO.size
SIZES = {Msg.HELLO: HELLO.size, Msg.CHALLENGE: CHALLENGE.size, Msg.PROOF: PROOF.size,
         Msg.ACCEPT: ACCEPT.size, Msg.REJECT: REJECT.size}
MAX_MESSAGE = max(SIZES.values())
_FIELDS = struct.Struct("<IIIIQ")  # src, dst, rail, epoch, expected
_REASON = struct.Struct("<I")
#: domain separation of every MAC of this version
_DOMAIN = b"linkescape/v%d/" % VERSION
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def _job(job: bytes) -> bytes:
    return job.rstrip(b"\0")[:JOB_SIZE]


@dataclass(frozen=True)
class Hello:
    """The dialer's first message.

    ``job`` ties the link to one communicator (a random token published in the
    store), ``epoch`` counts the times this link was (re)opened so that a stale
    connection cannot pass for the current one, ``expected`` is the next DATA
    seq the dialer expects from the acceptor (replay after a reconnect starts
    there), ``nonce`` the dialer's challenge, ``mac`` shows that the dialer
    holds the key (``hello_mac``). None of it is secret; the PROOF that
    follows authenticates all of it.
    """

    src: int
    dst: int
    rail: int
    epoch: int
    expected: int
    job: bytes
    nonce: bytes = bytes(NONCE_SIZE)
    version: int = VERSION
    mac: bytes = bytes(MAC_SIZE)

    def pack(self) -> bytes:
        return HELLO.pack(MAGIC, self.version, Msg.HELLO, self.src, self.dst, self.rail, self.epoch,
                          self.expected, self.job.ljust(JOB_SIZE, b"\0")[:JOB_SIZE],
                          self.nonce.ljust(NONCE_SIZE, b"\0")[:NONCE_SIZE],
                          self.mac.ljust(MAC_SIZE, b"\0")[:MAC_SIZE])

    @classmethod
    def unpack(cls, buf) -> "Hello":
        if len(buf) != HELLO_SIZE:
            raise HandshakeError(f"short handshake: {len(buf)} bytes")
        _check_prefix(buf, (Msg.HELLO,))
        _m, version, _t, src, dst, rail, epoch, expected, job, nonce, mac = HELLO.unpack(buf)
        return cls(src, dst, rail, epoch, expected, _job(job), nonce, version, mac)

    def check(self, *, job: bytes, dst: int, world_size: int, rails: int) -> None:
        if self.job != _job(job):
            raise HandshakeError("handshake from another job")
        if self.dst != dst:
            raise HandshakeError(f"handshake addressed to rank {self.dst}, this is rank {dst}")
        if not 0 <= self.src < world_size or self.src == dst:
            raise HandshakeError(f"handshake from invalid rank {self.src}")
        if not 0 <= self.rail < rails:
            raise HandshakeError(f"handshake on invalid rail {self.rail}")


def _check_prefix(buf, allowed) -> Msg:
    magic, version, kind = PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise HandshakeError(f"bad magic {magic:#x}: not a linkescape peer")
    if version != VERSION:
        raise HandshakeError(f"protocol version {version} is not {VERSION}")
    if kind not in allowed:
        name = Msg(kind).name if kind in SIZES else str(kind)
        raise HandshakeError(f"handshake message {name} where {'/'.join(Msg(a).name for a in allowed)} was due")
    return Msg(kind)


def proof(key: bytes, label: bytes, job: bytes, nonce_d: bytes, nonce_a: bytes, src: int, dst: int,
          rail: int, epoch: int, expected: int) -> bytes:
    """HMAC-SHA256 over both nonces, the job, both ranks, the rail, the epoch
    and the sender's expected seq."""
    job = _job(job)
    msg = b"".join((_DOMAIN, label, bytes([len(job)]), job, nonce_d, nonce_a,
                    _FIELDS.pack(src, dst, rail, epoch, expected)))
    return hmac.digest(key, msg, "sha256")


def hello_mac(key: bytes, hello: Hello) -> bytes:
    """``mac_h``: the HELLO's fields and the dialer's nonce under the key
    (no acceptor nonce yet: it shows the key, it opens nothing)."""
    return proof(key, b"hello", hello.job, hello.nonce, b"", hello.src, hello.dst, hello.rail, hello.epoch,
                 hello.expected)


def reject_mac(key: bytes, hello: Hello, reason: int) -> bytes:
    """``mac_r``: the REJECT's reason bound to the dial it answers (the
    dialer's fresh nonce and every HELLO field)."""
    return proof(key, b"reject" + _REASON.pack(reason), hello.job, hello.nonce, b"", hello.src, hello.dst,
                 hello.rail, hello.epoch, hello.expected)


class MessageReader:
    """Collects one fixed-size handshake message at a time. ``want()`` is the
    number of bytes still missing: the caller reads at most that many."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.allowed: Tuple[Msg, ...] = ()
        self.kind: Optional[Msg] = None

    def want(self) -> int:
        if self.kind is None:
            return PREFIX.size - len(self.buf)
        return SIZES[self.kind] - len(self.buf)

    def feed(self, data, pos: int) -> Tuple[int, Optional[Tuple[Msg, bytes]]]:
        """Take bytes from ``data[pos:]`` up to the end of the current message;
        returns the new position and the message once whole."""
        take = min(len(data) - pos, self.want())
        self.buf += data[pos:pos + take]
        pos += take
        if self.kind is None and len(self.buf) == PREFIX.size:
            self.kind = _check_prefix(self.buf, self.allowed)
        if self.kind is not None and len(self.buf) == SIZES[self.kind]:
            out = (self.kind, bytes(self.buf))
            self.buf.clear()
            self.kind = None
            return pos, out
        return pos, None


@dataclass(frozen=True)
class Proved:
    """The dialer proved the key: the acceptor decides (``admit``/``refuse``)."""

    peer: int
    rail: int
    epoch: int
    #: the next DATA seq the dialer expects from us
    peer_expected: int


@dataclass(frozen=True)
class Established:
    """Both sides proved the key; the link is open at ``epoch``."""

    peer: int
    rail: int
    epoch: int
    peer_expected: int
    #: the keys of this link alone (the frames' MACs, one per direction), from both nonces
    link_key: Optional["FrameKeys"] = None


class FrameKeys:
    """One side's two frame keys of one link: ``send`` MACs what this side
    writes, ``recv`` checks what it reads (the other side holds them swapped).
    Never printed."""

    __slots__ = ("send", "recv")

    def __init__(self, send: bytes, recv: bytes) -> None:
        if len(send) < 16 or len(recv) < 16:
            raise ValueError("a frame key needs at least 16 bytes")
        if hmac.compare_digest(send, recv):
            raise ValueError("the two directions of a link need two keys")
        self.send = bytes(send)
        self.recv = bytes(recv)

    def __eq__(self, other) -> bool:
        return isinstance(other, FrameKeys) and hmac.compare_digest(self.send + self.recv, other.send + other.recv)

    def __hash__(self) -> int:
        return hash(self.send)

    def __repr__(self) -> str:  # never the keys
        return "FrameKeys(...)"

    def swapped(self) -> "FrameKeys":
        return FrameKeys(self.recv, self.send)


def hkdf(ikm: bytes, salt: bytes, info: bytes, size: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract with ``salt``, expand with ``info``."""
    prk = hmac.digest(salt or bytes(32), ikm, "sha256")
    out, block, i = b"", b"", 1
    while len(out) < size:
        block = hmac.digest(prk, block + info + bytes([i]), "sha256")
        out += block
        i += 1
    return out[:size]


def link_keys(key: bytes, hello: "Hello", nonce_a: bytes, dialer: bool) -> FrameKeys:
    """The frame keys of one link, one per direction, for the dialer's side
    (``dialer``) or the acceptor's: both nonces make them fresh, the
    direction, job, ranks, rail and epoch bind them."""
    job = _job(hello.job)
    fields = bytes([len(job)]) + job + _FIELDS.pack(hello.src, hello.dst, hello.rail, hello.epoch, 0)
    salt = hello.nonce + nonce_a
    d2a = hkdf(key, salt, _DOMAIN + b"frames dialer->acceptor\0" + fields)
    a2d = hkdf(key, salt, _DOMAIN + b"frames acceptor->dialer\0" + fields)
    return FrameKeys(d2a, a2d) if dialer else FrameKeys(a2d, d2a)


class _Side:
    """What both state machines share: an outbox, a reader, a deadline."""

    state: str

    def __init__(self, key: bytes, job: bytes, deadline: float) -> None:
        if not isinstance(key, (bytes, bytearray)) or not key:
            raise HandshakeError("a link handshake needs a non-empty key")
        self.key = bytes(key)
        self.job = _job(job)
        self.deadline = deadline
        self.reader = MessageReader()
        self._out = bytearray()
        self.error: Optional[BaseException] = None

    @property
    def done(self) -> bool:
        return self.state in ("established", "failed")

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def want(self) -> int:
        return 0 if self.done or self.state == "deciding" else self.reader.want()

    def expired(self, now: float) -> bool:
        return not self.done and now > self.deadline

    def _fail(self, exc: BaseException, reject: Optional[Reject] = None,
              hello: Optional[Hello] = None) -> BaseException:
        """Fail with ``exc``; queue a REJECT (bound to ``hello``'s dial by
        ``mac_r`` when we have it) if ``reject`` says why."""
        self.state = "failed"
        self.error = exc
        if reject is not None:
            mac = reject_mac(self.key, hello, int(reject)) if hello is not None else bytes(MAC_SIZE)
            self._out += REJECT.pack(MAGIC, VERSION, Msg.REJECT, int(reject), mac)
        return exc

    def receive_data(self, data, now: float):
        """Feed bytes from the wire; returns an event (``Proved``,
        ``Established``) or None. Raises HandshakeError / AuthError."""
        if self.state == "failed":
            raise HandshakeError("handshake already failed")
        if now > self.deadline:
            raise self._fail(HandshakeError("handshake deadline passed"))
        if self.done or self.state == "deciding":
            if len(data):
                raise self._fail(HandshakeError(f"{len(data)} bytes after the handshake message"))
            return None
        pos, event = 0, None
        try:
            while pos < len(data):
                if self.done or self.state == "deciding":
                    raise HandshakeError(f"{len(data) - pos} bytes after the handshake message")
                pos, msg = self.reader.feed(data, pos)
                if msg is not None:
                    event = self._on_message(*msg) or event
        except HandshakeError as exc:
            if self.state != "failed":
                self._fail(exc)
            raise
        return event

    def _on_message(self, kind: Msg, raw: bytes):  # pragma: no cover - overridden
        raise NotImplementedError


class DialerHandshake(_Side):
    """The connecting side. Send ``data_to_send()`` at once (the HELLO), then
    feed what arrives until ``Established``."""

    def __init__(self, key: bytes, job: bytes, src: int, dst: int, rail: int, epoch: int, expected: int,
                 deadline: float, nonce: Optional[bytes] = None) -> None:
        super().__init__(key, job, deadline)
        for name, value, top in (("rank", src, _U32), ("rank", dst, _U32), ("rail", rail, _U32),
                                 ("epoch", epoch, _U32), ("expected", expected, _U64)):
            if not 0 <= value <= top:
                raise HandshakeError(f"{name} {value} does not fit the handshake")
        hello = Hello(src, dst, rail, epoch, expected, self.job,
                      nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE))
        self.hello = Hello(src, dst, rail, epoch, expected, self.job, hello.nonce, VERSION, hello_mac(self.key, hello))
        self.nonce_a = b""
        self._out += self.hello.pack()
        self.state = "challenge"
        self.reader.allowed = (Msg.CHALLENGE, Msg.REJECT)

    def _on_message(self, kind: Msg, raw: bytes):
        h = self.hello
        if kind is Msg.REJECT:
            raise self._fail(self._rejected(raw))
        if kind is Msg.CHALLENGE:
            self.nonce_a = CHALLENGE.unpack(raw)[3]
            mac = proof(self.key, b"dial", self.job, h.nonce, self.nonce_a, h.src, h.dst, h.rail, h.epoch,
                        h.expected)
            self._out += PROOF.pack(MAGIC, VERSION, Msg.PROOF, mac)
            self.state = "accept"
            self.reader.allowed = (Msg.ACCEPT, Msg.REJECT)
            return None
        _m, _v, _t, epoch, expected, mac = ACCEPT.unpack(raw)
        want = proof(self.key, b"accept", self.job, h.nonce, self.nonce_a, h.src, h.dst, h.rail, h.epoch, expected)
        if not hmac.compare_digest(mac, want):
            raise self._fail(AuthError(f"rank {h.dst} on rail {h.rail} answered without proving the key",
                                       peer=h.dst, rail=h.rail))
        if epoch != h.epoch:
            raise self._fail(HandshakeError(f"rank {h.dst} accepted epoch {epoch}, not {h.epoch}"))
        self.state = "established"
        return Established(h.dst, h.rail, h.epoch, expected, link_keys(self.key, h, self.nonce_a, dialer=True))

    def _rejected(self, raw: bytes) -> HandshakeError:
        """What a REJECT tells: only a REJECT that verifies with our key says
        why (its sender holds our key); any other is a forged REJECT or an
        acceptor with another key, and we cannot tell which."""
        h = self.hello
        reason, mac = REJECT.unpack(raw)[3:]
        why = Reject(reason).name if reason in Reject._value2member_map_ else str(reason)
        if not hmac.compare_digest(mac, reject_mac(self.key, h, reason)):
            return UnverifiedReject(
                f"rank {h.dst} rejected the link on rail {h.rail} (unverified): a forged REJECT or different keys "
                f"(LINKESCAPE_AUTH_KEY / LINKESCAPE_AUTH_KEY_FILE); it claims {why}, and its MAC does not verify "
                f"with our key", peer=h.dst, rail=h.rail, reason=why)
        if reason == Reject.BAD_PROOF:  # it holds our key, yet our proof failed there: altered on the way
            return HandshakeError(f"rank {h.dst} rejected our key proof on rail {h.rail} though it holds our key "
                                  f"(its REJECT verifies): the handshake was altered in flight")
        if reason == Reject.BAD_ROUTE:
            return RailMismatch(f"rank {h.dst} rejected our dial on rail {h.rail} as mis-routed: it arrived on "
                                f"another rail's listener or from an address that is not ours on rail {h.rail}",
                                peer=h.dst, rail=h.rail)
        return HandshakeError(f"rank {h.dst} refused the link on rail {h.rail}: {why}")


class AcceptorHandshake(_Side):
    """The accepting side of one connection. Feed what arrives; after
    ``Proved`` call ``admit(expected)`` or ``refuse(why)`` and send
    ``data_to_send()``. ``rank``: this rank; only higher ranks may dial.
    ``route``: called with a HELLO that showed the key; raises
    ``RailMismatch`` when the connection came in where that rail's link must
    not (the acceptor knows the listener and the source address)."""

    def __init__(self, key: bytes, job: bytes, rank: int, world_size: int, rails: int, deadline: float,
                 nonce: Optional[bytes] = None, route: Optional[Callable[[Hello], None]] = None) -> None:
        super().__init__(key, job, deadline)
        self.rank = rank
        self.route = route
        self.world_size = world_size
        self.rails = rails
        self.nonce_a = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self.hello: Optional[Hello] = None
        self.state = "hello"
        self.reader.allowed = (Msg.HELLO,)

    @property
    def progress(self) -> int:
        """How far this handshake got (0: no HELLO yet, 1: a HELLO that showed
        the key, 2: proved): under a flood the least advanced make room first.
        A stranger's HELLO is rejected on arrival: it never reaches 1."""
        return {"hello": 0, "proof": 1}.get(self.state, 2)

    def _on_message(self, kind: Msg, raw: bytes):
        if kind is Msg.HELLO:
            hello = Hello.unpack(raw)
            try:
                hello.check(job=self.job, dst=self.rank, world_size=self.world_size, rails=self.rails)
                if hello.src <= self.rank:
                    raise HandshakeError(f"rank {hello.src} must not dial lower rank {self.rank}")
            except HandshakeError as exc:
                raise self._fail(exc, Reject.BAD_HELLO, hello)
            if not hmac.compare_digest(hello.mac, hello_mac(self.key, hello)):
                raise self._fail(AuthError(f"a connection claiming rank {hello.src} on rail {hello.rail} sent a "
                                           f"HELLO without the key", peer=hello.src, rail=hello.rail),
                                 Reject.BAD_PROOF, hello)
            if self.route is not None:
                try:
                    self.route(hello)
                except RailMismatch as exc:
                    raise self._fail(exc, Reject.BAD_ROUTE, hello)
            self.hello = hello
            self._out += CHALLENGE.pack(MAGIC, VERSION, Msg.CHALLENGE, self.nonce_a)
            self.state = "proof"
            self.reader.allowed = (Msg.PROOF,)
            return None
        h = self.hello
        mac = PROOF.unpack(raw)[3]
        want = proof(self.key, b"dial", self.job, h.nonce, self.nonce_a, h.src, h.dst, h.rail, h.epoch, h.expected)
        if not hmac.compare_digest(mac, want):
            raise self._fail(AuthError(f"a connection claiming rank {h.src} on rail {h.rail} failed the key proof",
                                       peer=h.src, rail=h.rail), Reject.BAD_PROOF, h)
        self.state = "deciding"
        return Proved(h.src, h.rail, h.epoch, h.expected)

    def admit(self, expected: int) -> Established:
        """Accept the proved dialer: queue our proof and ``expected``."""
        if self.state != "deciding":
            raise HandshakeError(f"admit in state {self.state}")
        if not 0 <= expected <= _U64:
            raise HandshakeError(f"expected {expected} does not fit the handshake")
        h = self.hello
        mac = proof(self.key, b"accept", self.job, h.nonce, self.nonce_a, h.src, h.dst, h.rail, h.epoch, expected)
        self._out += ACCEPT.pack(MAGIC, VERSION, Msg.ACCEPT, h.epoch, expected, mac)
        self.state = "established"
        return Established(h.src, h.rail, h.epoch, h.expected, self.link_key)

    @property
    def link_key(self) -> FrameKeys:
        """This (the accepting) side's frame keys."""
        return link_keys(self.key, self.hello, self.nonce_a, dialer=False)

    def refuse(self, why: str) -> HandshakeError:
        """Turn down a proved dialer (stale epoch, rail down): queue REJECT."""
        return self._fail(HandshakeError(why), Reject.REFUSED, self.hello)  # type: ignore[return-value]


class LinkAuth:
    """The key, the job and this rank's place in it: makes the handshakes of
    this rank's links."""

    def __init__(self, key: bytes, job: bytes, rank: int, world_size: int, rails: int) -> None:
        if not key:
            raise HandshakeError("a link handshake needs a non-empty key")
        self.key = bytes(key)
        self.job = _job(job)
        self.rank = rank
        self.world_size = world_size
        self.rails = rails

    def __repr__(self) -> str:  # never the key
        return f"LinkAuth(rank={self.rank}, world_size={self.world_size}, rails={self.rails})"

    def dialer(self, peer: int, rail: int, epoch: int, expected: int, deadline: float) -> DialerHandshake:
        return DialerHandshake(self.key, self.job, self.rank, peer, rail, epoch, expected, deadline)

    def acceptor(self, deadline: float, route: Optional[Callable[[Hello], None]] = None) -> AcceptorHandshake:
        return AcceptorHandshake(self.key, self.job, self.rank, self.world_size, self.rails, deadline, route=route)


def decode_messages(data, allowed=tuple(Msg)) -> List[Tuple[Msg, bytes]]:
    """Split bytes into whole handshake messages (the fuzzers' entry point);
    raises HandshakeError at the first malformed one."""
    reader = MessageReader()
    reader.allowed = tuple(allowed)
    out, pos = [], 0
    while pos < len(data):
        pos, msg = reader.feed(data, pos)
        if msg is not None:
            kind, raw = msg
            if kind is Msg.HELLO:
                Hello.unpack(raw)
            out.append(msg)
    return out


__all__ = ["MAGIC", "VERSION", "HELLO", "HELLO_SIZE", "Hello", "Msg", "Reject", "proof", "hello_mac", "reject_mac",
           "MessageReader",
           "Proved", "Established", "FrameKeys", "hkdf", "link_keys", "DialerHandshake", "AcceptorHandshake", "LinkAuth", "decode_messages"]
