"""linkescape: collective communication over multi-rail TCP that survives link failures.

The package has two halves: the library (``src/linkescape``: what a training job imports) and
its tools (``tools/linkescape``: the CLI, testbed, faults, chaos, bench, demo, status, report,
cost model...), which the library never imports. One name spans both: in a source checkout the
tools' half joins the package's path here; an installed wheel holds both in one folder.
"""

import os as _os
import sys as _sys


def _tools_half(*package: str) -> list:
    """The folder of ``linkescape.<package>``'s tools in a source checkout (``tools/linkescape/...``
    beside ``src/``), as a list to add to that package's ``__path__``: empty when there is none."""
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    path = _os.path.join(root, "tools", "linkescape", *package)
    return [path] if _os.path.isdir(path) else []


__path__ += [p for p in _tools_half() if p not in __path__]

#: the modules that sat at the package's top until they went into folders (``common``: what
#: every floor shares; ``observe``: the flight recorder and metrics; ``comm``: the communicator
#: and its start-up): their old names are a contract (``linkescape.config``,
#: ``linkescape.errors``...), so each still imports, as the very same module object
MOVED = {name: "common" for name in ("auth", "config", "errors", "events", "extras", "jsonl", "log", "ops",
                                      "private", "store", "testing")}
MOVED.update({name: "observe" for name in ("flight", "metrics", "metrics_server")})
MOVED.update({name: "comm" for name in ("communicator", "rendezvous")})


class _OldName:
    """A finder and loader for ``linkescape.<old name>``: the module in its folder, imported
    once, under both names (its ``__spec__`` stays the folder's). Only the names in ``MOVED``."""

    def __init__(self) -> None:
        self._specs: dict = {}

    def find_spec(self, name, path=None, target=None):
        head, _, tail = name.partition(".")
        if head != __name__ or tail not in MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        import importlib

        old = spec.name.partition(".")[2]
        module = importlib.import_module(f"{__name__}.{MOVED[old]}.{old}")
        self._specs[spec.name] = module.__spec__  # (the import system writes the alias's spec over it next)
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name)


_sys.meta_path.append(_OldName())


def __getattr__(name: str):
    """``linkescape.<old name>`` as an attribute too (``linkescape.ops.BFLOAT16`` after ``import
    linkescape``): the package's ``__init__`` imported those modules when they were loose, which made
    each an attribute of the package; now the folder's module, imported under its old name."""
    if name in MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

from .comm.communicator import Communicator, Work
from .common.config import Config
from .common.errors import (AuthError, CollectiveMismatch, CommClosed, CommTimeout, ConfigError, GroupShrunk,
                            HandshakeError, InvalidBuffer, InvalidRank, LinkEscapeError, LinkFailure, PeerLost,
                            ProtocolError, RankExcluded, RendezvousError, UnsupportedDtype, UsageError)
from .common.ops import ReduceOp
from .common.store import FileStore

__version__ = "0.1.0"

__all__ = [
    "Communicator", "Work", "Config", "ReduceOp", "FileStore",
    "LinkEscapeError", "UsageError", "InvalidRank", "InvalidBuffer", "UnsupportedDtype", "ConfigError",
    "CollectiveMismatch", "HandshakeError", "AuthError", "ProtocolError", "CommTimeout", "RendezvousError",
    "LinkFailure", "PeerLost", "CommClosed", "GroupShrunk", "RankExcluded",
]
