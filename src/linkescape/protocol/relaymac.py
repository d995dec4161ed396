"""End-to-end MACs of relayed frames (issue 48), sans I/O.

Rules:
- A frame that a third rank passes on (RELAY) carries, before the pair's own
  frame, a trailer: the scheme (``SCHEME``), the origin's counter of relayed
  frames to that peer and a 16-byte tag, keyed BLAKE2b over the counter and
  the pair's frame (its header and payload), under a key of the direction
  (origin to destination).
- The pair's key comes from both ends' X25519 keys (protocol/x25519.py):
  each rank makes one at start-up and publishes its public half with its rail
  addresses. The shared secret goes through HKDF with the job's key as salt,
  bound to the job, both ranks and both public keys. A relay holds the job's
  key but not either private key, so it cannot forge, alter or re-address a
  frame, whether or not the pair ever shared a link and whether or not the
  relay also reads the pair's own rails; a stranger who swapped a public key
  in the store does not hold the job's key. (A rank of the job that rewrote
  another rank's record in the store before start-up read it could: see
  docs/security.md.)
- A frame that fails its tag counts against the relay's link it came on (that
  link only, never toward the limit that fails the job), never against the
  rank it names.
- Replays: the destination takes a counter once (the highest taken and a
  window of ``WINDOW`` below it, for frames reordered across the relay's
  rails); a counter taken before, or below the window, is dropped (no
  verdict: ``Unknown``). A peer whose public key this rank never read, or
  whose key the store gave of small order, has no key: its relayed frames are
  dropped the same way (no verdict), never blamed on the relay, and no relay
  is chosen for our frames to it (``can_seal``).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Dict, Optional

from ..common.errors import ProtocolError
from . import x25519
from .frames import RELAY_TRAILER
from .handshake import hkdf

TRAILER = struct.Struct("<B7xQ16s")  # scheme, counter, tag
assert TRAILER.size == RELAY_TRAILER
TAG_SIZE = 16
#: the only scheme: a pair key from both ranks' X25519 keys
SCHEME = 1
#: counters below the highest taken that may still come (reordered across the relay's rails)
WINDOW = 64
_DIR = struct.Struct("<II")
_CTR = struct.Struct("<Q")
_DOMAIN = b"linkescape relayed frames v1\0"


class Unknown(Exception):
    """A relayed frame from a peer whose public key we never read, or a counter taken before
    (a replay): no verdict, the frame is dropped."""


class RankKeys:
    """One rank's X25519 key, its peers' public keys (from the store) and the job's key:
    the pair keys of relayed frames (``pair``)."""

    __slots__ = ("rank", "public", "_private", "_secret", "_job", "_publics")

    def __init__(self, rank: int, secret: bytes = b"", job: bytes = b"", private: Optional[bytes] = None) -> None:
        self.rank = rank
        self._private = private or x25519.private_key()
        self.public = x25519.public_key(self._private)
        self._secret = bytes(secret)
        self._job = bytes(job)
        #: peer -> its public key (what its store record said)
        self._publics: Dict[int, bytes] = {}

    def __repr__(self) -> str:  # never the keys
        return f"RankKeys(rank {self.rank}, {len(self._publics)} peers)"

    def bind(self, secret: bytes, job: bytes) -> None:
        """The job's key and token, once start-up knows them (after the public key was published)."""
        self._secret = bytes(secret)
        self._job = bytes(job)

    def learn(self, peer: int, public: bytes) -> None:
        """``peer``'s public key, as its record in the store gave it."""
        if len(public) != x25519.KEY_SIZE:
            raise ValueError(f"rank {peer}'s public key has {len(public)} bytes, not {x25519.KEY_SIZE}")
        self._publics[peer] = bytes(public)

    def public_of(self, peer: int) -> Optional[bytes]:
        """``peer``'s public key as we read it (every rank of the job may read it: it is public)."""
        return self._publics.get(peer)

    def pair(self, peer: int) -> "PairKeys":
        return PairKeys(self.rank, peer, self)

    def derive(self, peer: int) -> bytes:
        """The key ``peer`` and we share (the same at both ends). ``Unknown``: we never read its
        public key, or the store gave one of small order (a forgery: no key can come of it)."""
        theirs = self._publics.get(peer)
        if theirs is None:
            raise Unknown(f"no public key of rank {peer}: its relayed frames cannot be authenticated")
        try:
            dh = x25519.shared(self._private, theirs)
        except ValueError as exc:
            raise Unknown(f"rank {peer}'s public key in the store is unusable ({exc})") from None
        lo, hi = sorted((self.rank, peer))
        pubs = (self.public, theirs) if self.rank == lo else (theirs, self.public)
        return hkdf(dh, self._secret, _DOMAIN + self._job + b"\0" + _DIR.pack(lo, hi) + pubs[0] + pubs[1])


class PairKeys:
    """The relayed frames of one pair, as one of its ends (``me``) seals and opens them."""

    __slots__ = ("me", "peer", "sent", "_keys", "_send", "_recv", "_top", "_bits")

    def __init__(self, me: int, peer: int, keys: RankKeys) -> None:
        self.me = me
        self.peer = peer
        #: our counter of sealed frames
        self.sent = 0
        self._keys = keys
        self._send: Optional[bytes] = None
        self._recv: Optional[bytes] = None
        #: the highest counter taken, and a bitmap of the WINDOW counters below it
        self._top = 0
        self._bits = 0

    def __repr__(self) -> str:  # never the keys
        return f"PairKeys({self.me}<->{self.peer})"

    def _derive(self) -> None:
        base = self._keys.derive(self.peer)  # (once: one X25519 multiplication, ~1 ms)
        self._send = hmac.digest(base, _DIR.pack(self.me, self.peer), "sha256")
        self._recv = hmac.digest(base, _DIR.pack(self.peer, self.me), "sha256")

    def can_seal(self) -> bool:
        """Whether we hold a usable public key of the peer (else ``seal`` raises ``Unknown``):
        a relay is chosen for the pair only then. The first call derives the key (~1 ms)."""
        if self._send is None:
            try:
                self._derive()
            except Unknown:
                return False
        return True

    def seal(self, header: bytes, payload=b"") -> bytes:
        """The trailer of a frame of ours (``header``, ``payload``) for the peer."""
        if self._send is None:
            self._derive()
        self.sent += 1
        h = hashlib.blake2b(_CTR.pack(self.sent), key=self._send, digest_size=TAG_SIZE)
        h.update(header)
        if len(payload):
            h.update(payload)
        return TRAILER.pack(SCHEME, self.sent, h.digest())

    def open(self, frame: memoryview) -> memoryview:
        """The pair's frame inside a relayed one from the peer, once its tag verified.
        ``ProtocolError``: forged or altered (the relay's doing); ``Unknown``: no verdict (no
        public key of the peer, a counter taken before)."""
        if len(frame) < TRAILER.size:
            raise ProtocolError(f"relayed frame of {len(frame)} bytes has no trailer", peer=self.peer)
        scheme, counter, tag = TRAILER.unpack_from(frame)
        if scheme != SCHEME:
            raise ProtocolError(f"relayed frame 'from rank {self.peer}' without an end-to-end MAC "
                                f"(scheme {scheme})", peer=self.peer)
        if self._recv is None:
            self._derive()
        inner = frame[TRAILER.size:]
        h = hashlib.blake2b(_CTR.pack(counter), key=self._recv, digest_size=TAG_SIZE)
        h.update(inner)
        if not hmac.compare_digest(h.digest(), tag):
            raise ProtocolError(f"relayed frame 'from rank {self.peer}' fails its end-to-end MAC (forged or "
                                f"altered by the relay)", peer=self.peer)
        top, bits = self._top, self._bits
        if counter > top:
            shift = counter - top  # the old highest moves into the window
            self._top, self._bits = counter, ((bits << shift) | (1 << (shift - 1))) & ((1 << WINDOW) - 1)
        else:
            back = top - counter  # 0: the highest itself
            if back == 0 or back > WINDOW or bits >> (back - 1) & 1:
                raise Unknown(f"relayed frame {counter} of rank {self.peer} taken before (a replay)")
            self._bits = bits | 1 << (back - 1)
        return inner


__all__ = ["RankKeys", "PairKeys", "TRAILER", "SCHEME", "WINDOW", "Unknown"]
