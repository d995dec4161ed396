"""docs/operations.md's cost and simulate numbers come from the commands shown beside them, and
scripts/operations_numbers.py knows every table and value the document names."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOC = os.path.join(ROOT, "docs", "operations.md")


def script():
    spec = importlib.util.spec_from_file_location("operations_numbers",
                                                  os.path.join(ROOT, "scripts", "operations_numbers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_marker_is_known_to_the_script():
    mod, text = script(), open(DOC, encoding="utf-8").read()
    assert set(mod.TABLE.findall(text)) <= set(mod.TABLES) and mod.TABLE.findall(text)
    assert set(mod.VALUE.findall(text)) <= set(mod.VALUES) and mod.VALUE.findall(text)
    runs = mod.RUN.findall(text)
    assert runs and all(re.match(r"linkescape (cost|simulate)\b", c) for c in runs)
    assert "failures.csv" in dict(mod.FILE.findall(text))
    # each block shows the command it ran
    for cmd in runs:
        assert f"<!-- run: {cmd} -->\n```\n$ {cmd}\n" in text, cmd


FAST = [c for c in re.findall(r"<!-- run: (linkescape [^>]*?) -->", open(DOC, encoding="utf-8").read())
        if "--sweep" not in c and "--plot" not in c]


@pytest.mark.parametrize("cmd", FAST)
def test_the_blocks_are_what_the_commands_print(cmd):
    mod, text = script(), open(DOC, encoding="utf-8").read()
    runner = mod.Runner(dict(mod.FILE.findall(text)))
    block = re.search(re.escape(f"<!-- run: {cmd} -->") + r"\n```\n\$ [^\n]*\n(.*?)```\n<!-- /run -->", text, re.S)
    assert block.group(1).rstrip() == runner.text(cmd).rstrip(), (
        f"docs/operations.md is not current for `{cmd}`: run python scripts/operations_numbers.py")


def test_the_values_in_the_text_are_current():
    mod, text = script(), open(DOC, encoding="utf-8").read()
    runner = mod.Runner({})
    for name, shown in re.findall(r"<!-- v: ([a-z0-9_.-]+) -->(.*?)<!-- /v -->", text):
        cmd, get = mod.VALUES[name]
        if "simulate" in cmd:
            continue  # the simulate blocks above carry the same numbers
        assert shown == get(runner.json(cmd)), (name, shown)
