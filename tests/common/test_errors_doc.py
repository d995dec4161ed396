"""docs/errors.md names every class of linkescape.errors, with its place in the hierarchy, and nothing else."""

from __future__ import annotations

import inspect
import pathlib
import re

from linkescape import errors

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def _rows():
    """[(class name, depth)] of the table, in order: depth from the &nbsp; indent (two per level)."""
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| ((?:&nbsp;)*)`(\w+)`", line)
        if m:
            rows.append((m.group(2), m.group(1).count("&nbsp;") // 2))
    return rows


def test_the_table_names_every_error_class_and_nothing_else():
    classes = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.LinkEscapeError)}
    names = [n for n, _ in _rows()]
    assert len(names) == len(set(names)), names
    assert set(names) == classes, (sorted(classes - set(names)), sorted(set(names) - classes))


def test_each_row_is_a_subclass_of_the_row_it_is_indented_under():
    parents = []  # the last row seen at each depth
    for name, depth in _rows():
        cls = getattr(errors, name)
        parents[depth:] = [cls]
        if depth:
            assert issubclass(cls, parents[depth - 1]), (name, parents[depth - 1].__name__)
        elif name != "LinkEscapeError":
            assert cls.__bases__[0] is errors.LinkEscapeError, name
