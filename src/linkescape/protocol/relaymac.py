"""End-to-end MACs of relayed frames (issue 48), sans I/O.

Rules:
- A frame that a third rank passes on (RELAY) carries, before the pair's own
  frame, a trailer: the key id (the rail and epoch of a link between the two
  ends of the pair) and a 16-byte tag, keyed BLAKE2b over the direction
  (origin and destination ranks) and the pair's frame (its header and
  payload).
- The key is the pair's own: ``handshake.link_keys`` derives it (``pair``)
  from the job's key and both nonces of a handshake between the two ends. A
  relay holds the job's key but never saw those nonces (they crossed the
  pair's own link), so it can pass frames on and cannot forge, alter or
  re-address one: a frame it made fails its tag at the destination, which
  counts it against the relay's link it came on, never against the rank it
  names.
- Each end keeps the keys of its pair's links, per rail the first and the
  newest epoch (``KEEP``): the origin seals with the key of the pair's first
  link (both ends adopted that one: the start-up link, or the first dial), the
  destination looks the id up. An id it does not hold (a link it has not
  adopted yet) is no verdict: the frame is dropped and sent again. A pair whose ends never
  shared a link has no key: its frames carry ``NO_KEY`` and are taken only
  while the destination holds no key of that pair either (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Dict, Optional, Tuple

from ..errors import ProtocolError
from .frames import RELAY_TRAILER

TRAILER = struct.Struct("<BxxxI16s")  # rail, epoch, tag
assert TRAILER.size == RELAY_TRAILER
TAG_SIZE = 16
#: the key id of a pair without a key of its own (its ends never shared a link)
NO_KEY = 0xFF
#: keys kept per rail: the first epoch's and the newest
KEEP = 2
_DIR = struct.Struct("<II")


class Unknown(Exception):
    """A relayed frame under a key id this end does not hold (yet): no verdict."""


class PairKeys:
    """The relay keys of one pair, as one of its ends (``me``) holds them."""

    __slots__ = ("me", "peer", "keys", "primary", "_dir")

    def __init__(self, me: int, peer: int) -> None:
        self.me = me
        self.peer = peer
        #: rail -> {epoch: key}
        self.keys: Dict[int, Dict[int, bytes]] = {}
        #: the id of the first key added (what we seal with: the pair's first link, both ends hold it)
        self.primary: Optional[Tuple[int, int]] = None
        #: (rail, epoch, sending) -> the key of that direction
        self._dir: Dict[Tuple[int, int, bool], bytes] = {}

    def __repr__(self) -> str:  # never the keys
        return f"PairKeys({self.me}<->{self.peer}, {sum(len(v) for v in self.keys.values())} keys)"

    def add(self, rail: int, epoch: int, key: bytes) -> None:
        if not key or not 0 <= rail < NO_KEY:
            return
        per = self.keys.setdefault(rail, {})
        per[epoch] = bytes(key)
        if self.primary is None:
            self.primary = (rail, epoch)
        while len(per) > KEEP:  # the first and the newest stay
            old = sorted(per)[1]
            del per[old]
            self._dir.pop((rail, old, True), None)
            self._dir.pop((rail, old, False), None)

    def _key(self, rail: int, epoch: int, sending: bool) -> bytes:
        k = self._dir.get((rail, epoch, sending))
        if k is None:
            base = self.keys.get(rail, {}).get(epoch)
            if base is None:
                raise Unknown(f"relay key {rail}/{epoch} of rank {self.peer}")
            src, dst = (self.me, self.peer) if sending else (self.peer, self.me)
            k = self._dir[(rail, epoch, sending)] = hmac.digest(base, b"linkescape relayed frames\0"
                                                                + _DIR.pack(src, dst), "sha256")
        return k

    def seal(self, header: bytes, payload=b"") -> bytes:
        """The trailer of a frame of ours (``header``, ``payload``) for the peer."""
        if self.primary is None:
            return TRAILER.pack(NO_KEY, 0, bytes(TAG_SIZE))
        rail, epoch = self.primary
        h = hashlib.blake2b(header, key=self._key(rail, epoch, True), digest_size=TAG_SIZE)
        if len(payload):
            h.update(payload)
        return TRAILER.pack(rail, epoch, h.digest())

    def open(self, frame: memoryview) -> memoryview:
        """The pair's frame inside a relayed one from the peer, once its tag
        verified. ``ProtocolError``: forged or altered (the relay's doing);
        ``Unknown``: a key id we do not hold (no verdict)."""
        if len(frame) < TRAILER.size:
            raise ProtocolError(f"relayed frame of {len(frame)} bytes has no trailer", peer=self.peer)
        rail, epoch, tag = TRAILER.unpack_from(frame)
        inner = frame[TRAILER.size:]
        if rail == NO_KEY:
            if self.keys:
                raise ProtocolError(f"relayed frame 'from rank {self.peer}' without a key, while we share one",
                                    peer=self.peer)
            return inner
        want = hashlib.blake2b(inner, key=self._key(rail, epoch, False), digest_size=TAG_SIZE).digest()
        if not hmac.compare_digest(want, tag):
            raise ProtocolError(f"relayed frame 'from rank {self.peer}' fails its end-to-end MAC (forged or "
                                f"altered by the relay)", peer=self.peer)
        return inner


__all__ = ["PairKeys", "TRAILER", "NO_KEY", "KEEP", "Unknown"]
