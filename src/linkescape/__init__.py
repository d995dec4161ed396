"""linkescape: collective communication over multi-rail TCP that survives link failures."""

from .communicator import Communicator, Work
from .config import Config
from .errors import (AuthError, CollectiveMismatch, CommClosed, CommTimeout, ConfigError, GroupShrunk, HandshakeError,
                     InvalidBuffer, InvalidRank, LinkEscapeError, LinkFailure, PeerLost, ProtocolError, RankExcluded,
                     RendezvousError, UnsupportedDtype, UsageError)
from .ops import ReduceOp
from .store import FileStore

__version__ = "0.1.0"

__all__ = [
    "Communicator", "Work", "Config", "ReduceOp", "FileStore",
    "LinkEscapeError", "UsageError", "InvalidRank", "InvalidBuffer", "UnsupportedDtype", "ConfigError",
    "CollectiveMismatch", "HandshakeError", "AuthError", "ProtocolError", "CommTimeout", "RendezvousError",
    "LinkFailure", "PeerLost", "CommClosed", "GroupShrunk", "RankExcluded",
]
