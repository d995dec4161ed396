"""linkescape: collective communication over multi-rail TCP that survives link failures.

The package has two halves: the library (``src/linkescape``: what a training job imports) and
its tools (``tools/linkescape``: the CLI, testbed, faults, chaos, bench, demo, status, report,
cost model...), which the library never imports. One name spans both: in a source checkout the
tools' half joins the package's path here; an installed wheel holds both in one folder.
"""

import os as _os


def _tools_half(*package: str) -> list:
    """The folder of ``linkescape.<package>``'s tools in a source checkout (``tools/linkescape/...``
    beside ``src/``), as a list to add to that package's ``__path__``: empty when there is none."""
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    path = _os.path.join(root, "tools", "linkescape", *package)
    return [path] if _os.path.isdir(path) else []


__path__ += [p for p in _tools_half() if p not in __path__]

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
