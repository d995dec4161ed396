"""The floors hold: a module imports only floors below its own, and no
import circle exists, counting every import: at module level, under
``if TYPE_CHECKING``, and inside functions (docs/architecture.md)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the package's two halves: the library, and the tools around it (docs/architecture.md)
SRC = ROOT / "src" / "linkescape"
TOOLS_HALF = ROOT / "tools" / "linkescape"

# lowest first; shared helpers may be imported from anywhere
FLOORS = [
    {"protocol"},
    {"transport", "health"},
    {"engine"},
    {"algorithms", "observe"},  # what the communicator uses (observe: the flight recorder, metrics)
    {"comm"},  # the communicator and its start-up (rendezvous)
]
# common: errors, config, events, log, store, auth, ops, jsonl, extras, private, testing
SHARED = {"common"}


def _floor(top: str) -> int:
    for i, names in enumerate(FLOORS):
        if top in names:
            return i
    return len(FLOORS)  # integrations: torch, cli, testbed, faults, chaos, bench, demo, tools, ...


def _modules(halves=(SRC, TOOLS_HALF)):
    for half in halves:
        for path in half.rglob("*.py"):
            rel = path.relative_to(half).with_suffix("")
            yield ".".join(rel.parts), path


def _imports(name: str, path: pathlib.Path, module_level_only: bool):
    tree = ast.parse(path.read_text())
    pkg = name.split(".")[:-1] if not path.name == "__init__.py" else name.split(".")[:-1]
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            target = ".".join(base + ([node.module] if node.module else []))
            yield target
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("linkescape."):
            yield node.module[len("linkescape."):]


def _top(name: str) -> str:
    return name.split(".")[0] if name else ""


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_no_module_imports_a_floor_above_its_own(name, path):
    mine = _floor(_top(name))
    for target in _imports(name, path, module_level_only=False):
        top = _top(target)
        if not top or top in SHARED:
            continue
        assert _floor(top) <= mine, f"{name} (floor {mine}) imports {target} (floor {_floor(top)})"


def test_no_import_circle_anywhere():
    graph = {}
    names = {n for n, _ in _modules()}
    for name, path in _modules():
        deps = set()
        for target in _imports(name, path, module_level_only=False):
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    state: dict = {}

    def visit(n, stack):
        state[n] = 1
        for d in graph.get(n, ()):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if d not in state:
                visit(d, stack + [d])
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n, [n])


def test_peers_and_their_halves_hold_no_reference_to_the_engine():
    """peer.py (and its timers), receiver.py and sender.py import nothing of the engine's core
    (nor the driver, recovery or liveness): what they need is given to them."""
    for mod in ("peer", "peer_timers", "receiver", "sender"):
        path = SRC / "engine" / f"{mod}.py"
        targets = set(_imports(f"engine.{mod}", path, module_level_only=False))
        assert not targets & {"engine.core", "engine.driver", "engine.recovery", "engine.liveness",
                              "engine.completion", "engine.beacon"}, (mod, targets)
        text = path.read_text()
        assert "Engine" not in text.replace("engine", ""), mod


def test_no_module_reaches_a_thousand_lines():
    """One concept per module, a few hundred lines each (../STYLE.md: split by lifecycle before a
    module reaches a thousand)."""
    long = {name: n for name, path in _modules() if (n := len(path.read_text().splitlines())) >= 1000}
    assert not long, long


#: the library: what a training job imports (docs/architecture.md, "The library and its tools")
LIBRARY = set().union(*FLOORS) | SHARED | {"torch", "__init__", "torchft.__init__", "torchft.process_group",
                                            "torchft.reuse"}
#: the tools around it, which the library never imports
TOOLS = {"cli", "testbed", "faults", "chaos", "bench", "demo", "tools", "torchft.analysis",
         "torchft.configure_time", "torchft.demo", "torchft.run", "torchft.train"}


def _part(name: str, parts: set) -> bool:
    """Whether module ``name`` is in ``parts`` (a package there, or the module itself)."""
    return _top(name) in parts or name in parts or any(name.startswith(p + ".") for p in parts)


def test_the_library_never_imports_the_tools():
    """Issue 49: the library (protocol, transport, health, engine, algorithms, the communicator,
    the torch backend, torchft's process group and the shared modules) imports nothing of the
    tools (the CLI, testbed, faults, chaos, bench, demo, tools, and torchft's demos and
    measurements), however deep the import; every module is one or the other."""
    names = [name for name, _ in _modules()]
    neither = [n for n in names if not _part(n, LIBRARY) and not _part(n, TOOLS)]
    assert not neither, neither
    for name, path in _modules():
        if not _part(name, LIBRARY):
            continue
        for target in _imports(name, path, module_level_only=False):
            assert not _part(target, TOOLS), f"library module {name} imports the tool {target}"


def test_the_folders_are_the_library_and_its_tools():
    """Issue 49: the layout shows it: src/linkescape holds the library and nothing else,
    tools/linkescape the tools and nothing else (one package name spans both)."""
    misplaced = [f"src/linkescape: {n}" for n, _ in _modules([SRC]) if not _part(n, LIBRARY)]
    misplaced += [f"tools/linkescape: {n}" for n, _ in _modules([TOOLS_HALF]) if not _part(n, TOOLS)]
    assert not misplaced, misplaced
    assert not (TOOLS_HALF / "__init__.py").exists()  # the tools join linkescape's package, they are not another
    import linkescape
    import linkescape.torchft

    assert [pathlib.Path(p).resolve() for p in linkescape.__path__] == [SRC, TOOLS_HALF]
    assert pathlib.Path(linkescape.torchft.__path__[-1]).resolve() == TOOLS_HALF / "torchft"


def test_the_librarys_top_holds_folders_only_and_every_old_name_still_imports():
    """Issue 49: no loose module beside the folders (but the package's ``__init__``); the names
    the loose modules had (``linkescape.config``, ``linkescape.errors``...) are a contract: each
    imports, as the very module in its folder, in a fresh interpreter."""
    import subprocess
    import sys

    import linkescape

    loose = sorted(p.name for p in SRC.glob("*.py") if p.name != "__init__.py")
    assert loose == [], loose
    for old, folder in linkescape.MOVED.items():
        assert (SRC / folder / f"{old}.py").is_file(), (old, folder)
    # Each is an attribute of the package after ``import linkescape`` alone, as when the package's
    # ``__init__`` imported the loose modules (``linkescape.ops.BFLOAT16``; a test that used it passed
    # only when another test in its process had imported ``linkescape.ops`` first): checked first,
    # before anything imports the old names (an import sets the attribute too).
    code = ("import importlib, sys, linkescape\n"
            "for old, folder in linkescape.MOVED.items():\n"
            "    assert getattr(linkescape, old) is importlib.import_module('linkescape.' + folder + '.' + old), old\n"
            "assert linkescape.ops.BFLOAT16 is not None\n"
            "assert not hasattr(linkescape, 'no_such_module')\n"
            "for old, folder in linkescape.MOVED.items():\n"
            "    a = importlib.import_module('linkescape.' + old)\n"
            "    b = importlib.import_module('linkescape.' + folder + '.' + old)\n"
            "    assert a is b and a.__spec__.name == b.__name__ == 'linkescape.' + folder + '.' + old, old\n"
            "from linkescape.config import Config\n"
            "from linkescape.errors import PeerLost\n"
            "assert Config is linkescape.Config and PeerLost is linkescape.PeerLost\n"
            "print(len(linkescape.MOVED))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "16", (out.stdout, out.stderr)
