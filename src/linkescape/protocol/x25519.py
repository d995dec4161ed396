"""X25519 (RFC 7748), sans I/O: each rank's Diffie-Hellman key for the
end-to-end MACs of relayed frames (protocol/relaymac.py).

Pure Python on integers, written from the RFC's description (the Montgomery
ladder of section 5). One scalar multiplication costs about 1 ms here; a rank
makes one for its public key at start-up and one per peer whose frames are
relayed, the first time (never on a frame's path after that). Not constant
time: Python's integers are not, so a process that can time this one to the
microsecond might learn bits of its key; that key protects only relayed
frames of one job and dies with it."""

from __future__ import annotations

import secrets

_P = 2 ** 255 - 19
_A24 = 121665
#: the u-coordinate of the base point
BASE = (9).to_bytes(32, "little")
KEY_SIZE = 32


def _scalar(k: bytes) -> int:
    b = bytearray(k)
    b[0] &= 248
    b[31] &= 127
    b[31] |= 64
    return int.from_bytes(b, "little")


def x25519(k: bytes, u: bytes) -> bytes:
    """The X25519 function of RFC 7748: scalar ``k`` times the point of u-coordinate ``u``."""
    if len(k) != KEY_SIZE or len(u) != KEY_SIZE:
        raise ValueError("X25519 takes 32-byte scalars and u-coordinates")
    n = _scalar(k)
    ub = bytearray(u)
    ub[31] &= 127
    x1 = int.from_bytes(ub, "little") % _P
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    p = _P
    for t in range(254, -1, -1):
        bit = (n >> t) & 1
        if swap ^ bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a = x2 + z2
        aa = a * a % p
        b = x2 - z2
        bb = b * b % p
        e = aa - bb
        c = x3 + z3
        d = x3 - z3
        da = d * a % p
        cb = c * b % p
        x3 = (da + cb) ** 2 % p
        z3 = x1 * (da - cb) ** 2 % p
        x2 = aa * bb % p
        z2 = e * (aa + _A24 * e) % p
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, p - 2, p) % p).to_bytes(KEY_SIZE, "little")


def private_key() -> bytes:
    return secrets.token_bytes(KEY_SIZE)


def public_key(private: bytes) -> bytes:
    return x25519(private, BASE)


def shared(private: bytes, public: bytes) -> bytes:
    """The secret two ranks share; ``ValueError`` for a public key of small order (all zeros: the
    check RFC 7748 section 6.1 asks for), which a forger could pick to fix the result."""
    out = x25519(private, public)
    if not any(out):
        raise ValueError("a public key of small order")
    return out


__all__ = ["BASE", "KEY_SIZE", "x25519", "private_key", "public_key", "shared"]
