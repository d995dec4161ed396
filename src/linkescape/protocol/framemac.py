"""Frame authentication (``LINKESCAPE_FRAME_AUTH=1``), sans I/O.

Rules:
- Each link has two keys of its own from its handshake, one per direction
  (``handshake.link_keys``, HKDF: both nonces make them fresh, the direction,
  its ranks, rail and epoch bind them). A side MACs what it sends with one
  and checks what it reads with the other, so a frame reflected back to its
  sender fails, though both counters start at 0.
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
    """The two directions' counters and keys (``keys``: a
    ``handshake.FrameKeys``, or any object with ``send`` and ``recv``)."""

    __slots__ = ("send_key", "recv_key", "sent", "received")

    def __init__(self, keys) -> None:
        send, recv = getattr(keys, "send", None), getattr(keys, "recv", None)
        if not isinstance(send, (bytes, bytearray)) or not isinstance(recv, (bytes, bytearray)):
            raise TypeError("frame MACs need a key per direction (handshake.FrameKeys), not one key")
        if len(send) < 16 or len(recv) < 16:
            raise ValueError("a frame key needs at least 16 bytes")
        if hmac.compare_digest(bytes(send), bytes(recv)):
            raise ValueError("the two directions of a link need two keys: one key lets a frame be reflected")
        self.send_key = bytes(send[:64])
        self.recv_key = bytes(recv[:64])
        self.sent = 0
        self.received = 0

    def __repr__(self) -> str:  # never the keys
        return f"FrameMac(sent={self.sent}, received={self.received})"

    def seal(self, *parts) -> bytes:
        """The tag of the next frame we send (its header and payload, in parts)."""
        h = _blake2b(self.sent.to_bytes(8, "little"), key=self.send_key, digest_size=TAG_SIZE)
        for part in parts:
            h.update(part)
        self.sent += 1
        return h.digest()

    def check(self, tag, *parts) -> bool:
        """Whether ``tag`` is the next received frame's."""
        h = _blake2b(self.received.to_bytes(8, "little"), key=self.recv_key, digest_size=TAG_SIZE)
        for part in parts:
            h.update(part)
        self.received += 1
        return hmac.compare_digest(h.digest(), bytes(tag))


__all__ = ["FrameMac", "TAG_SIZE"]
