"""Which links a new torchft quorum can keep: the decision, pure.

torchft's ``configure`` gives a replica only the quorum's store address, its
rank and the world size. To keep the links to the replicas that stay, each
member of the new quorum writes an *offer* under the quorum's store prefix:
the group it is in now (the store address that group was built from, which
every member of that group shares), its rank and size there, and the ranks
that group knows to be gone. Every member reads every offer, so every member
takes the same decision from the same words:

* **shrink** the current group (``Communicator.shrink``: no handshake, no
  store exchange, no new sockets) when every member of the new quorum is in
  the same current group, they keep their order (the new ranks are the old
  ones renumbered densely, as ``shrink`` numbers them), at least one old rank
  is left out, and every rank known gone is among those left out;
* otherwise **build** a new group, as torchft's Gloo group does: a replica
  that joins or comes back, a group that was aborted or timed out, the same
  members again (a step that failed without a member leaving), an order that
  changed.

Cost: one store write and N reads per member (N the new quorum's size), as
the store exchange of a new group; no scan of ranks outside the quorum.
"""

from __future__ import annotations

import json
from typing import List, Optional, Sequence

#: the keys of the offers, under the quorum's store prefix
PREFIX = "linkescape/torchft/offer/"


def offer(group: Optional[str], rank: int, size: int, lost: Sequence[int]) -> bytes:
    """This member's words: ``group`` ``None`` when it has no group to keep."""
    if group is None:
        return b"{}"
    return json.dumps({"group": group, "rank": int(rank), "size": int(size), "lost": sorted(int(r) for r in lost)},
                      separators=(",", ":")).encode()


def parse(raw: bytes) -> dict:
    try:
        words = json.loads(bytes(raw).decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return words if isinstance(words, dict) else {}


def excluded(offers: Sequence[dict]) -> Optional[List[int]]:
    """The old ranks to leave out when the new quorum (``offers`` by new rank) can shrink the group
    its members are in; ``None`` when it must build a new one."""
    if not offers:
        return None
    first = offers[0]
    group, size = first.get("group"), first.get("size")
    if not isinstance(group, str) or not isinstance(size, int):
        return None
    olds: List[int] = []
    lost = set()
    for o in offers:
        if o.get("group") != group or o.get("size") != size or not isinstance(o.get("rank"), int):
            return None
        olds.append(o["rank"])
        lost.update(r for r in o.get("lost", ()) if isinstance(r, int))
    if any(not 0 <= r < size for r in olds) or any(a >= b for a, b in zip(olds, olds[1:])):
        return None  # a rank out of range, twice, or out of order: the renumbering would differ
    out = sorted(set(range(size)) - set(olds))
    if not out or not lost <= set(out):
        return None  # the same members (shrink leaves someone out), or a member that stays is gone
    return out


__all__ = ["PREFIX", "offer", "parse", "excluded"]
