"""Which rails have carrier, as level state both ends can rely on (sans I/O).

Rules:
- Each rank keeps a *rail word*: bits 0-7 say which of its NICs lost
  carrier, bits 8-15 a generation that grows (mod 256) with every change.
- Every frame header carries the sender's word, so the peer learns a change
  from the next frame on any link, and a notification lost with its link
  loses nothing: the state is repeated, never told once.
- Frames on different links can overtake each other, so the receiver
  applies a word only when its generation is newer than the last applied
  (within half the generation space); an older word is ignored.
- Rails from the ninth on are not carried (they rely on silence detection).
"""

from __future__ import annotations

from typing import List, Tuple

RAIL_BITS = 8
_GEN_SHIFT = 8
_GEN_MASK = 0xFF


class RailWord:
    """This rank's rails without carrier."""

    def __init__(self) -> None:
        self.word = 0

    @property
    def mask(self) -> int:
        return self.word & ((1 << RAIL_BITS) - 1)

    def is_down(self, rail: int) -> bool:
        return rail < RAIL_BITS and bool(self.mask >> rail & 1)

    def set(self, rail: int, down: bool) -> bool:
        """Record ``rail`` as down or up; True when the word changed."""
        if not 0 <= rail < RAIL_BITS:
            return False
        mask = self.mask
        new = mask | (1 << rail) if down else mask & ~(1 << rail)
        if new == mask:
            return False
        gen = ((self.word >> _GEN_SHIFT) + 1) & _GEN_MASK
        self.word = (gen << _GEN_SHIFT) | new
        return True


class PeerRails:
    """What the peer's frames said of its rails."""

    def __init__(self) -> None:
        self.word = 0

    def is_down(self, rail: int) -> bool:
        return rail < RAIL_BITS and bool(self.word >> rail & 1)

    def apply(self, word: int) -> Tuple[List[int], List[int]]:
        """Apply a word from a frame: the rails that went down and came up
        since the last word applied; nothing for a word that is not newer."""
        old = self.word
        if word == old:
            return [], []
        ahead = ((word >> _GEN_SHIFT) - (old >> _GEN_SHIFT)) & _GEN_MASK
        if not 0 < ahead < 128:
            return [], []
        self.word = word
        down = [r for r in range(RAIL_BITS) if word >> r & 1 and not old >> r & 1]
        up = [r for r in range(RAIL_BITS) if old >> r & 1 and not word >> r & 1]
        return down, up


__all__ = ["RailWord", "PeerRails", "RAIL_BITS"]
