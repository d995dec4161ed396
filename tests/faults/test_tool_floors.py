"""The tools' floors (issue 11): the testbed needs no fault schedule, the fault schedule no tool, and the
tools (bench, chaos, demo) reach each other only through what they share: faults and testbed. Below them
all, the parts every tool uses (JSON lines, the extras) import nothing of linkescape (issue 19)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import linkescape

#: the package's two halves: the library (src/linkescape) and, in a checkout, its tools (tools/linkescape)
HALVES = [pathlib.Path(p) for p in linkescape.__path__]


def _half(path: pathlib.Path) -> pathlib.Path:
    return next(h for h in HALVES if h in path.parents)


def _rel(path: pathlib.Path) -> pathlib.Path:
    return path.relative_to(_half(path))


def _file(rel: str) -> pathlib.Path:
    """The module at ``rel`` (``"demo/faultplan.py"``) in whichever half holds it."""
    return next(h / rel for h in HALVES if (h / rel).exists())
#: lowest first; a package may import its own floor and those below
FLOORS = [{"common"}, {"testbed"}, {"faults"}, {"bench", "chaos", "demo"}]
#: the shared parts of the tools: single modules of the library's common folder (the bottom floor)
SHARED_PARTS = ("common/jsonl", "common/extras")


def _floor(pkg: str):
    return next((i for i, names in enumerate(FLOORS) if pkg in names), None)


def _targets(path: pathlib.Path):
    """The linkescape top-level packages or modules a module imports (anywhere in it)."""
    parts = list(_rel(path).parts[:-1])  # the packages the file is in
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = parts[: len(parts) - (node.level - 1)]
            names = [node.module] if node.module else [a.name for a in node.names]
            for name in names:
                yield ".".join(base + [name]).split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("linkescape."):
            yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("linkescape."):
                    yield a.name.split(".")[1]


def test_the_import_finder_sees_relative_imports():
    found = set(_targets(_file("demo/faultplan.py")))
    assert "faults" in found  # from .. import faults
    assert {"testbed"} <= set(_targets(_file("bench/failover/job.py")))  # from ...testbed.job import


def _files(name: str):
    for half in HALVES:
        if (half / f"{name}.py").exists():
            return [half / f"{name}.py"]
    return [path for half in HALVES for path in (half / name).rglob("*.py")]


def test_the_shared_parts_import_nothing_of_linkescape():
    for name in SHARED_PARTS:
        assert set(_targets(_file(f"{name}.py"))) == set(), name


def test_tool_packages_import_only_their_floor_and_below():
    bad = []
    for names in FLOORS:
        for pkg in names:
            mine = _floor(pkg)
            for path in _files(pkg):
                for top in _targets(path):
                    f = _floor(top)
                    if f is None or top == pkg:
                        continue
                    if f >= mine:
                        bad.append(f"{_rel(path)} imports {top}")
    assert not bad, bad


def test_every_tool_module_imports_on_its_own():
    """Each module in a fresh interpreter (an import circle that only bites in some import order)."""
    mods = []
    for pkg in SHARED_PARTS + ("testbed", "faults", "bench", "chaos", "demo"):
        for path in sorted(_files(pkg)):
            rel = _rel(path).with_suffix("")
            if rel.name == "__main__":
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods.append("linkescape." + ".".join(parts))
    # one interpreter per module, run in a few processes at once
    code = ("import subprocess, sys\n"
            "from concurrent.futures import ThreadPoolExecutor\n"
            "mods = sys.argv[1:]\n"
            "def one(m):\n"
            "    r = subprocess.run([sys.executable, '-c', 'import ' + m], capture_output=True, text=True)\n"
            "    return m, r.returncode, r.stderr[-400:]\n"
            "with ThreadPoolExecutor(4) as ex:\n"
            "    bad = [x for x in ex.map(one, mods) if x[1]]\n"
            "print(bad)\n"
            "sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
