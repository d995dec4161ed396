"""Frame authentication (``LINKESCAPE_FRAME_AUTH=1``), sans I/O.

Rules:
- Each link has a key of its own from its handshake (``handshake.link_key``:
  both nonces make it fresh, its ranks, rail and epoch bind it).
- Every frame on the link is followed by a 16-byte tag: keyed BLAKE2b over
  the frame's position on the link in that direction (a counter of frames,
  from 0), its header and its payload. TCP keeps the order, so both ends
  count alike; a frame forged, altered, replayed, reordered or moved from
  another link fails its tag.
- A frame is acted on only once its tag verified: the receiver reads it whole
  first. A tag that fails is a protocol error of that link (it goes down and
  is re-dialed), never the job's.
"""

from __future__ import annotations

import hashlib
import hmac

TAG_SIZE = 16
_blake2b = hashlib.blake2b


class FrameMac:
    """The two directions' counters and the link's key."""

    __slots__ = ("key", "sent", "received")

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a frame key needs at least 16 bytes")
        self.key = bytes(key[:64])
        self.sent = 0
        self.received = 0

    def seal(self, *parts) -> bytes:
        """The tag of the next frame we send (its header and payload, in parts)."""
        h = _blake2b(self.sent.to_bytes(8, "little"), key=self.key, digest_size=TAG_SIZE)
        for part in parts:
            h.update(part)
        self.sent += 1
        return h.digest()

    def check(self, tag, *parts) -> bool:
        """Whether ``tag`` is the next received frame's."""
        h = _blake2b(self.received.to_bytes(8, "little"), key=self.key, digest_size=TAG_SIZE)
        for part in parts:
            h.update(part)
        self.received += 1
        return hmac.compare_digest(h.digest(), bytes(tag))


__all__ = ["FrameMac", "TAG_SIZE"]
