"""Issue 49: the Driver and Recovery reach the engine only through their own
small interfaces (engine/ports.py). Read from their source: every attribute
taken of the engine (``self.engine.X``, or a local ``eng``/``engine`` that is
the engine) is a member of its port, and ``Engine`` provides every member."""

from __future__ import annotations

import ast
import pathlib

import pytest

from linkescape import Config
from linkescape.engine import core
from linkescape.engine.core import Engine
from linkescape.engine.ports import DriverPort, RecoveryPort

SRC = pathlib.Path(core.__file__).parent


def _members(port) -> set:
    """A port's attributes (annotated) and methods."""
    return set(port.__annotations__) | {n for n, v in vars(port).items() if callable(v) and not n.startswith("_")}


def _reached(module: str) -> set:
    """The attributes a module takes of the engine."""
    tree = ast.parse((SRC / module).read_text())
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("eng", "engine"):
            out.add(node.attr)
        elif (isinstance(base, ast.Attribute) and base.attr == "engine" and isinstance(base.value, ast.Name)
              and base.value.id == "self"):
            out.add(node.attr)
    return out


@pytest.mark.parametrize("module, port", [("driver.py", DriverPort), ("recovery.py", RecoveryPort)])
def test_a_module_reaches_the_engine_only_through_its_port(module, port):
    reached = _reached(module)
    members = _members(port)
    assert reached, module  # (the scan sees the module's uses)
    assert reached <= members, f"{module} reaches past {port.__name__}: {sorted(reached - members)}"


@pytest.mark.parametrize("port", [DriverPort, RecoveryPort])
def test_the_engine_provides_every_member_of_each_port(port):
    e = Engine(0, 2, 1, Config())
    try:
        missing = [m for m in _members(port) if not hasattr(e, m)]
        assert not missing, missing
        public = [n for n in dir(e) if not n.startswith("_")]
        assert len(_members(port)) < len(public) / 2, (len(_members(port)), len(public))  # small
    finally:
        e.close_io()
