"""The rank's peers, by rank, built when first looked up (engine/core.py).

Costs: a dict of the peers built so far: the ring neighbours at start-up from
16 ranks on, then every peer (O(N) channels, each O(rails) links)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from .peer import PeerChannel


class PeerTable(dict):
    """The rank's peers, by rank. A peer's channel is built when first looked up with
    ``table[rank]`` (``get`` and iteration see only those built): start-up builds its
    ring neighbours' (``Engine(peers_now=)``) and the progress thread the rest right
    after (``Engine.build_peers``), off the caller's path. ``build`` (the engine's)
    builds one and marks its links for Recovery to open, as start-up's backups are."""

    __slots__ = ("ranks", "me", "build")

    def __init__(self, ranks: range, me: int, build: Callable[[int], "PeerChannel"]) -> None:
        super().__init__()
        self.ranks = ranks
        self.me = me
        self.build = build

    def __missing__(self, rank: int) -> "PeerChannel":
        if type(rank) is not int or rank == self.me or rank not in self.ranks:
            raise KeyError(rank)
        return self.build(rank)

    def find(self, rank) -> Optional["PeerChannel"]:
        """The peer ``rank`` (built now if it was not), None if there is no such peer."""
        try:
            return self[rank]
        except KeyError:
            return None


__all__ = ["PeerTable"]
