"""A part whose extra is missing says which one to install (linkescape.extras, pyproject's extras)."""

from __future__ import annotations

import pathlib
import sys

import click
import pytest
from click.testing import CliRunner

from linkescape import extras

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_missing_module_names_the_extra_and_is_a_click_error():
    with pytest.raises(ImportError) as info:
        extras.require(["json", "no_such_module_here", "prometheus_client_missing.parser"], "metrics", "the part")
    msg = str(info.value)
    assert msg == ("the part needs no_such_module_here and prometheus_client_missing, which are not installed: "
                   "pip install 'linkescape[metrics]'")
    assert isinstance(info.value, click.ClickException)
    assert extras.module("json", "plot", "x").dumps([1]) == "[1]"

    @click.command()
    def cmd():
        extras.require(["no_such_module_here"], "demo", "linkescape demo")

    res = CliRunner().invoke(cmd, [])
    assert res.exit_code == 1 and "Error: linkescape demo needs no_such_module_here" in res.output
    assert "pip install 'linkescape[demo]'" in res.output and "Traceback" not in res.output


def test_the_demo_and_the_picture_name_their_extra_when_matplotlib_is_missing(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    from linkescape.cli import main
    from linkescape.tools.timeline import draw_timeline

    with pytest.raises(extras.MissingExtra, match=r"pip install 'linkescape\[plot\]'"):
        draw_timeline(str(tmp_path / "x.png"), [], [], title="t", xlabel="x", t_end=1.0)
    res = CliRunner().invoke(main, ["demo", "--out", str(tmp_path / "demo")])
    assert res.exit_code == 1 and "pip install 'linkescape[demo]'" in res.output, res.output
    assert not (tmp_path / "demo" / "faulty").exists()  # nothing started


def test_status_names_the_metrics_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    from linkescape.cli import main

    res = CliRunner().invoke(main, ["status", "--targets", "127.0.0.1:1", "--once"])
    assert res.exit_code == 1 and "pip install 'linkescape[metrics]'" in res.output, res.output


#: the module each declared distribution provides
_MODULE = {"ml-dtypes": "ml_dtypes", "prometheus-client": "prometheus_client"}


def _imported_top_modules() -> set:
    """Every top-level module the package imports, anywhere in it, other than its own and the standard library's."""
    import ast

    out = set()
    for path in [*(ROOT / "src" / "linkescape").rglob("*.py"), *(ROOT / "tools" / "linkescape").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module.split(".")[0])
    return {m for m in out if m != "linkescape" and m not in sys.stdlib_module_names}


def test_declared_dependencies_are_the_used_ones():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def modules(reqs):
        names = {r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in reqs}
        return {_MODULE.get(n, n) for n in names}

    extra = meta["optional-dependencies"]
    base = modules(meta["dependencies"])
    assert base == {"numpy", "ml_dtypes", "click", "rich"}
    assert extra["torch"] == ["torch==2.13.0"]  # the one version CI installs (Makefile)
    assert "pip install -q torch==2.13.0" in (ROOT / "Makefile").read_text()
    declared = base | modules(r for name, reqs in extra.items() if name != "dev" for r in reqs)
    used = _imported_top_modules()
    assert declared <= used, declared - used  # nothing declared and unused (pyroute2 was)
    assert used <= declared | modules(extra["dev"]), used - declared  # pytest: the testbed's pytest fixtures
