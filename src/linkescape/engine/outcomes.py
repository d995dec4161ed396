"""What a peer reports to the engine after each call into it.

A ``PeerChannel`` (and its ``Sender`` and ``Receiver``) never reaches into
the engine: it changes its own state and reports what the rest of the rank
must do as outcomes, which the engine applies in order once the call has
returned. So a receive never re-enters the engine from inside a read loop,
and every effect a peer has on others is visible in one place (the
engine's ``_apply``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class Outcome:
    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


class Emit(Outcome):
    """An event for the trail (``link_down``, ``failover``, ``relay_on``, ...)."""

    __slots__ = ("event", "rail", "cause", "extra")

    def __init__(self, event: str, rail: int, cause: Optional[str], extra: Optional[Dict[str, Any]] = None):
        self.event = event
        self.rail = rail
        self.cause = cause
        self.extra = extra or {}


class LinkDown(Outcome):
    """A link left service. ``severed``: it stays open but unused (an
    emulated cut), to be closed when its rail returns."""

    __slots__ = ("link", "severed")

    def __init__(self, link, severed: bool = False):
        self.link = link
        self.severed = severed


class LinkUp(Outcome):
    """A link on ``rail`` (re-)entered service."""

    __slots__ = ("rail",)

    def __init__(self, rail: int):
        self.rail = rail


class NoPath(Outcome):
    """No rail to the peer is left (a relay may still be found)."""

    __slots__ = ()


class PathBack(Outcome):
    """The peer is reachable again (directly or through a relay)."""

    __slots__ = ()


class RecvDone(Outcome):
    """A receive has all its bytes."""

    __slots__ = ("message",)

    def __init__(self, message):
        self.message = message


class OpFailed(Outcome):
    __slots__ = ("op", "error")

    def __init__(self, op, error: BaseException):
        self.op = op
        self.error = error


class Fatal(Outcome):
    """The communicator cannot go on (the ranks disagree, a peer keeps
    breaking the protocol)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class Redial(Outcome):
    """A link of this peer should be re-dialed now (it went down, or the
    peer's NIC came back)."""

    __slots__ = ()


class Closed(Outcome):
    """The peer said BYE: the operations that still need it fail with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class LostReported(Outcome):
    """The peer told us (``PEER_LOST``) that ``lost_rank`` is gone."""

    __slots__ = ("lost_rank",)

    def __init__(self, lost_rank: int):
        self.lost_rank = lost_rank


class Forward(Outcome):
    """(relay) A frame from this peer for ``dst``, to pass on."""

    __slots__ = ("dst", "frame")

    def __init__(self, dst: int, frame: memoryview):
        self.dst = dst
        self.frame = frame


class Relayed(Outcome):
    """(relay) A frame from ``src`` that this peer passed on to us, on ``link`` (this peer's link
    it came on: a bad one counts against that link, not against ``src``)."""

    __slots__ = ("src", "frame", "link")

    def __init__(self, src: int, frame: memoryview, link=None):
        self.src = src
        self.frame = frame
        self.link = link


class Unreachable(Outcome):
    """(relay) This peer cannot pass our frames on to ``dst``."""

    __slots__ = ("dst",)

    def __init__(self, dst: int):
        self.dst = dst


class RelayReset(Outcome):
    """(relay) This peer lost frames it was passing on to ``dst``: what is
    unacknowledged must be sent again."""

    __slots__ = ("dst",)

    def __init__(self, dst: int):
        self.dst = dst


class RelayEnded(Outcome):
    """The relay through ``path.via`` stopped carrying our frames for this
    peer: a rail took over (``why`` ``path_back``), or the relay was lost
    (``unreachable``, ``via_lost``, ``timeout``, ``protocol_error``). The
    route ends; a lost relay is not asked first for a while, and while the
    peer has no path another is looked for at once (a relay lost is not a
    reason to wait for the next search). Reported before the ``NoPath`` that
    may follow, so that search already knows."""

    __slots__ = ("path", "why")

    def __init__(self, path, why: str):
        self.path = path
        self.why = why


NOTHING: tuple = ()

__all__ = ["Outcome", "Emit", "LinkDown", "LinkUp", "NoPath", "PathBack", "RecvDone", "OpFailed", "Fatal",
           "Redial", "Closed", "LostReported", "Forward", "Relayed", "Unreachable", "RelayReset",
           "RelayEnded", "NOTHING"]
