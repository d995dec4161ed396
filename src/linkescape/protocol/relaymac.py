"""End-to-end MACs of relayed frames (issue 48), sans I/O.

Rules:
- A frame that a third rank passes on (RELAY) carries, before the pair's own
  frame, a trailer: the key id (the rail and epoch of a link between the two
  ends of the pair), the origin's counter of relayed frames to that peer and a
  16-byte tag, keyed BLAKE2b over the direction (origin and destination
  ranks), the counter and the pair's frame (its header and payload).
- The key is the pair's own: ``handshake.link_keys`` derives it (``pair``)
  from the job's key and both nonces of a handshake between the two ends. The
  nonces cross the pair's own link in the clear: a relay that is not on that
  link's path never saw them and cannot forge, alter or re-address a frame;
  one that also sits on the path of the pair's own link could (docs/security.md).
  A frame that fails its tag counts against the relay's link it came on (that
  link only, never toward the limit that fails the job), never against the
  rank it names.
- Replays: the destination takes a counter once per key id (the highest taken
  and a window of ``WINDOW`` below it, for frames reordered across the relay's
  rails); a counter taken before, or below the window, is dropped (no verdict).
- Each end keeps the keys of its pair's links, per rail the first and the
  newest epoch (``KEEP``). The origin seals with the newest key that the peer
  has shown it holds (``confirm``: a frame of the peer's came on that link, or a
  relayed frame of the peer's verified under it); before any, with the first
  key added. The destination looks the id up: an id it does not hold (a link it
  has not adopted yet, or an ACCEPT it never read) is no verdict (``Unknown``):
  the frame is dropped and sent again. A pair whose ends never shared a link
  has no key: its frames carry ``NO_KEY`` and are taken only while the
  destination holds no key of that pair either; while it holds one, a frame
  without a key is no verdict either (the origin may not have adopted the
  pair's first link yet: frames in flight).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import ProtocolError
from .frames import RELAY_TRAILER

TRAILER = struct.Struct("<BxxxIQ16s")  # rail, epoch, counter, tag
assert TRAILER.size == RELAY_TRAILER
TAG_SIZE = 16
#: the key id of a pair without a key of its own (its ends never shared a link)
NO_KEY = 0xFF
#: keys kept per rail: the first epoch's and the newest
KEEP = 2
#: counters below the highest taken that may still come (reordered across the relay's rails)
WINDOW = 64
_DIR = struct.Struct("<II")
_CTR = struct.Struct("<Q")


class Unknown(Exception):
    """A relayed frame under a key id this end does not hold (yet), without a key while we
    hold one, or a counter taken before (a replay): no verdict, the frame is dropped."""


class PairKeys:
    """The relay keys of one pair, as one of its ends (``me``) holds them."""

    __slots__ = ("me", "peer", "keys", "primary", "confirmed", "sent", "_pending", "_seen", "_dir")

    def __init__(self, me: int, peer: int) -> None:
        self.me = me
        self.peer = peer
        #: rail -> {epoch: key}
        self.keys: Dict[int, Dict[int, bytes]] = {}
        #: the id of the first key added (what we seal with before the peer confirmed any)
        self.primary: Optional[Tuple[int, int]] = None
        #: the ids the peer has shown it holds, newest last (the last is what we seal with)
        self.confirmed: List[Tuple[int, int]] = []
        #: our counter of sealed frames (for every key: the peer takes each once per key)
        self.sent = 0
        #: (rail, epoch) -> whether its link has carried a frame of the peer's yet
        self._pending: Dict[Tuple[int, int], Callable[[], bool]] = {}
        #: (rail, epoch) -> (highest counter taken, bitmap of the WINDOW counters below it)
        self._seen: Dict[Tuple[int, int], Tuple[int, int]] = {}
        #: (rail, epoch, sending) -> the key of that direction
        self._dir: Dict[Tuple[int, int, bool], bytes] = {}

    def __repr__(self) -> str:  # never the keys
        return f"PairKeys({self.me}<->{self.peer}, {sum(len(v) for v in self.keys.values())} keys)"

    def add(self, rail: int, epoch: int, key: bytes, heard: Optional[Callable[[], bool]] = None) -> None:
        """The key of a link of the pair we adopted; ``heard``: whether that link has carried a
        frame of the peer's yet (then the peer holds the key: ``confirm``)."""
        if not key or not 0 <= rail < NO_KEY:
            return
        per = self.keys.setdefault(rail, {})
        per[epoch] = bytes(key)
        if self.primary is None:
            self.primary = (rail, epoch)
        if heard is not None:
            self._pending[(rail, epoch)] = heard
        while len(per) > KEEP:  # the first and the newest stay
            old = sorted(per)[1]
            del per[old]
            self._forget((rail, old))

    def _forget(self, kid: Tuple[int, int]) -> None:
        self._dir.pop(kid + (True,), None)
        self._dir.pop(kid + (False,), None)
        self._pending.pop(kid, None)
        self._seen.pop(kid, None)
        if kid in self.confirmed:
            self.confirmed.remove(kid)

    def confirm(self, rail: int, epoch: int) -> None:
        """The peer holds the key ``rail``/``epoch`` (it sent us a frame under it)."""
        kid = (rail, epoch)
        self._pending.pop(kid, None)
        if epoch not in self.keys.get(rail, ()) or (self.confirmed and self.confirmed[-1] == kid):
            return
        if kid in self.confirmed:
            self.confirmed.remove(kid)
        self.confirmed.append(kid)

    def sealing(self) -> Optional[Tuple[int, int]]:
        """The key id we seal with: the newest the peer confirmed, else the first added."""
        if self._pending:
            for kid, heard in list(self._pending.items()):
                if heard():
                    self.confirm(*kid)
        return self.confirmed[-1] if self.confirmed else self.primary

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
        kid = self.sealing()
        if kid is None:
            return TRAILER.pack(NO_KEY, 0, 0, bytes(TAG_SIZE))
        rail, epoch = kid
        self.sent += 1
        h = hashlib.blake2b(_CTR.pack(self.sent), key=self._key(rail, epoch, True), digest_size=TAG_SIZE)
        h.update(header)
        if len(payload):
            h.update(payload)
        return TRAILER.pack(rail, epoch, self.sent, h.digest())

    def open(self, frame: memoryview) -> memoryview:
        """The pair's frame inside a relayed one from the peer, once its tag
        verified. ``ProtocolError``: forged or altered (the relay's doing);
        ``Unknown``: no verdict (a key id we do not hold, no key while we hold
        one, a counter taken before)."""
        if len(frame) < TRAILER.size:
            raise ProtocolError(f"relayed frame of {len(frame)} bytes has no trailer", peer=self.peer)
        rail, epoch, counter, tag = TRAILER.unpack_from(frame)
        inner = frame[TRAILER.size:]
        if rail == NO_KEY:
            if self.keys:  # the origin may not hold the pair's first key yet (frames in flight)
                raise Unknown(f"relayed frame 'from rank {self.peer}' without a key, while we hold one")
            return inner
        h = hashlib.blake2b(_CTR.pack(counter), key=self._key(rail, epoch, False), digest_size=TAG_SIZE)
        h.update(inner)
        if not hmac.compare_digest(h.digest(), tag):
            raise ProtocolError(f"relayed frame 'from rank {self.peer}' fails its end-to-end MAC (forged or "
                                f"altered by the relay)", peer=self.peer)
        kid = (rail, epoch)
        top, bits = self._seen.get(kid, (0, 0))
        if counter > top:
            shift = counter - top  # the old highest moves into the window
            self._seen[kid] = (counter, ((bits << shift) | (1 << (shift - 1))) & ((1 << WINDOW) - 1))
        else:
            back = top - counter  # 0: the highest itself
            if back == 0 or back > WINDOW or bits >> (back - 1) & 1:
                raise Unknown(f"relayed frame {counter} of rank {self.peer} taken before (a replay)")
            self._seen[kid] = (top, bits | 1 << (back - 1))
        if not self.confirmed or self.confirmed[-1] != kid:
            self.confirm(rail, epoch)
        return inner


__all__ = ["PairKeys", "TRAILER", "NO_KEY", "KEEP", "WINDOW", "Unknown"]
