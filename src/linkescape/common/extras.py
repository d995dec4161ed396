"""The optional parts and what they need: a part whose extra is not installed says which one to install.

The base install (numpy, ml-dtypes, click, rich) runs ``import linkescape``,
the torch backend (with the torch the job already has) and the
``linkescape`` command. The extras (``pip install 'linkescape[NAME]'``):

* ``torch``: torch, the version CI tests (``linkescape bench --backend gloo``, ``--scale``);
* ``metrics``: prometheus-client (``LINKESCAPE_METRICS_PORT``, ``linkescape status``);
* ``plot``: matplotlib (the timeline pictures: ``linkescape report --png``, ``simulate --plot``);
* ``demo``: torch and matplotlib (``linkescape demo``).

A :class:`MissingExtra` is also a ``click.ClickException``: a command that
meets it ends with ``Error: <what> needs <package> ...: pip install
'linkescape[<extra>]'`` and status 1, with no traceback. Imports nothing of
linkescape: every floor may use it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Sequence

import click

#: the distribution that provides a top-level module, where the names differ
_DISTRIBUTION = {"prometheus_client": "prometheus-client"}


class MissingExtra(click.ClickException, ImportError):
    """A part needs a package of an extra that is not installed."""


def require(modules: Sequence[str], extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` naming ``pip install 'linkescape[extra]'`` unless ``modules`` are installed.

    Looks for them without importing them (no seconds spent importing torch, and no import in progress in
    one thread while another forks)."""
    missing = []
    for name in modules:
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is None:
            missing.append(_DISTRIBUTION.get(top, top))
    if missing:
        raise MissingExtra(f"{what} needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                           f"not installed: pip install 'linkescape[{extra}]'")


def module(name: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(name)``, or :class:`MissingExtra` naming the extra."""
    require([name], extra, what)
    return importlib.import_module(name)


__all__ = ["MissingExtra", "require", "module"]
