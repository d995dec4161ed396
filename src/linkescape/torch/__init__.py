"""torch.distributed integration: the ``"linkescape"`` backend.

``import linkescape.torch`` registers the backend (it is also registered by
the ``torch.backends`` entry point when torch is imported), then::

    dist.init_process_group("linkescape")

Names exported lazily: ``ProcessGroupLinkEscape``, ``LinkEscapeBackendError``,
``LinkEscapeWork``, ``get_communicator``.
"""

from __future__ import annotations

from .backend import BACKEND_NAME, _autoload, is_registered, register

_autoload()

_LAZY = {
    "ProcessGroupLinkEscape": "process_group",
    "close_all": "process_group",
    "make_config": "process_group",
    "get_communicator": "process_group",
    "LinkEscapeBackendError": "work",
    "LinkEscapeWork": "work",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'linkescape.torch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


__all__ = ["BACKEND_NAME", "register", "is_registered", *_LAZY]
