"""One hierarchy of typed errors.

Every error says who failed: the local side or the remote one, which rail, which
peer. Tests and callers match on types and attributes, never on message text.
"""

from __future__ import annotations

from typing import Optional, Sequence


class LinkEscapeError(Exception):
    """Base class of every error linkescape raises."""

    def __reduce__(self):
        # Keyword-only constructors do not survive pickling by default; errors
        # cross process boundaries (tests, torch futures), so rebuild by state.
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def _rebuild(cls, message, state):
    obj = cls.__new__(cls)
    Exception.__init__(obj, message)
    obj.__dict__.update(state)
    return obj


# ---------------------------------------------------------------- usage errors
class UsageError(LinkEscapeError, ValueError):
    """The caller passed something invalid; nothing was sent."""


class InvalidRank(UsageError):
    def __init__(self, rank: int, world_size: int, what: str = "rank"):
        super().__init__(f"{what} {rank} is not in [0, {world_size})")
        self.rank = rank
        self.world_size = world_size


class InvalidBuffer(UsageError):
    """Not a C-contiguous numpy array, wrong shape, read-only, ..."""


class UnsupportedDtype(UsageError, TypeError):
    """The dtype cannot be reduced with the requested operation."""


class ConfigError(UsageError):
    """A LINKESCAPE_* variable or a config field has an invalid value."""


# ------------------------------------------------------------- protocol errors
class CollectiveMismatch(LinkEscapeError):
    """Ranks called different collectives, or the same one with different
    shapes, dtypes, ops or roots."""

    def __init__(self, message: str, *, peer: Optional[int] = None, op_seq: Optional[int] = None):
        super().__init__(message)
        self.peer = peer
        self.op_seq = op_seq


class HandshakeError(LinkEscapeError):
    """A connection failed the linkescape handshake (wrong magic, version or job)."""


class NotYet(HandshakeError):
    """A link this rank accepts only later: it is still starting up, and the
    link is one that start-up does not open (a backup dialed early by a peer
    whose start-up is done). The dialer tries again, as after any failed dial;
    nothing is wrong."""


class AuthError(HandshakeError):
    """A link handshake failed the key proof: the other side does not hold the
    job's key (LINKESCAPE_AUTH_KEY differs between the ranks, or a stranger).
    ``peer`` is the rank that could not be authenticated (or that a stranger
    claimed to be), ``rail`` the rail of the link."""

    def __init__(self, message: str, *, peer: Optional[int] = None, rail: Optional[int] = None):
        super().__init__(message)
        self.peer = peer
        self.rail = rail


class UnverifiedReject(AuthError):
    """The acceptor answered a dial with a REJECT whose MAC does not verify
    with our key: a forged REJECT (whoever can write into the connection), or
    an acceptor that holds another key. The dialer cannot tell which, and
    says so. ``reason`` is the reason code the REJECT claims."""

    def __init__(self, message: str, *, peer: Optional[int] = None, rail: Optional[int] = None,
                 reason: Optional[str] = None):
        super().__init__(message, peer=peer, rail=rail)
        self.reason = reason


class RailMismatch(HandshakeError):
    """A link arrived where its rail says it must not: on the listener of
    another rail, or from an address that is not the claimed rank's address
    on that rail (a mis-routed dial would make "rail r" a link on the wrong
    NIC). ``peer`` and ``rail`` are the link's rank and rail as claimed."""

    def __init__(self, message: str, *, peer: Optional[int] = None, rail: Optional[int] = None):
        super().__init__(message)
        self.peer = peer
        self.rail = rail


class ProtocolError(LinkEscapeError):
    """A peer sent something that breaks the wire protocol."""

    def __init__(self, message: str, *, peer: Optional[int] = None, rail: Optional[int] = None):
        super().__init__(message)
        self.peer = peer
        self.rail = rail


# ------------------------------------------------------------ runtime failures

class FrameAuthError(ProtocolError):
    """A frame failed its MAC (``LINKESCAPE_FRAME_AUTH``): forged, altered or
    out of place on the path. It costs that link (re-dialed, replayed), never
    the job: it is not the peer's fault, so it does not count toward the
    limit of links a peer may break."""

class CommTimeout(LinkEscapeError, TimeoutError):
    """An operation did not complete within the configured timeout."""

    def __init__(self, message: str, *, peers: Sequence[int] = (), op_seq: Optional[int] = None):
        super().__init__(message)
        self.peers = tuple(peers)
        self.op_seq = op_seq


class RendezvousError(LinkEscapeError):
    """The store exchange failed or a peer never arrived."""

    def __init__(self, message: str, *, missing: Sequence[int] = ()):
        super().__init__(message)
        self.missing = tuple(missing)


class LinkFailure(LinkEscapeError):
    """Every rail between this rank and a peer has been down for longer than
    the no-path deadline."""

    def __init__(self, message: str, *, peer: int, rails: Sequence[int] = (), since: Optional[float] = None,
                 local: Optional[bool] = None):
        super().__init__(message)
        self.peer = peer
        self.rails = tuple(rails)
        self.since = since
        self.local = local


class PeerLost(LinkEscapeError):
    """A peer process died or closed its communicator; not a link failure."""

    def __init__(self, message: str, *, peer: int):
        super().__init__(message)
        self.peer = peer


class CommClosed(LinkEscapeError):
    """The communicator was closed locally; the operation did not run."""


class GroupShrunk(CommClosed):
    """The group was shrunk (``Communicator.shrink``): an operation in flight
    on the old group was ended by it, or a call was made on the old group
    after it. ``excluded``: the ranks the shrink left out (old numbering)."""

    def __init__(self, message: str, *, excluded: Sequence[int] = ()):
        super().__init__(message)
        self.excluded = tuple(excluded)


class RankExcluded(PeerLost):
    """``peer`` was left out of the group by a shrink: nothing is sent to it or
    taken from it any more (its links are closed, its re-dials refused)."""


__all__ = [name for name in dir() if name[0].isupper() and name not in ("Optional", "Sequence")]
