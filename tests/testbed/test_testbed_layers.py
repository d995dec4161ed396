"""The testbed's modules form floors: faults need a testbed, the testbed does not need faults."""

from __future__ import annotations

import ast
import pathlib

import linkescape.testbed as pkg

SRC = pathlib.Path(pkg.__file__).parent


def _imports(module: str) -> set:
    """Sibling modules that ``module`` imports anywhere (top level or inside functions)."""
    tree = ast.parse((SRC / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("linkescape.testbed."):
            out.add(node.module.split(".")[2])
    return out


def test_netns_does_not_import_faults():
    assert "faults" not in _imports("netns")
    assert _imports("netns") <= {"shell", "nft"}


def test_lower_floors_import_nothing_above_them():
    assert _imports("shell") == set()
    assert _imports("nft") <= {"shell"}
    assert _imports("faults") <= {"shell", "nft", "netns"}


def test_the_parts_shared_with_the_tools_stand_alone():
    """The exact values and results of the workloads, and the NIC sampler (process and handle), need
    no testbed module: the workers and the sampler process load only them."""
    assert _imports("exact") == set()
    assert _imports("sampler") == set()
    assert _imports("counters") == set()


def test_testbed_has_its_fault_methods_whichever_module_is_imported_first():
    import subprocess
    import sys

    code = ("from linkescape.testbed.netns import Testbed\n"
            "print(all(callable(getattr(Testbed, m, None)) for m in "
            "('cut', 'blackhole', 'lossy', 'repair', 'restore', 'flap', 'flap_async')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
