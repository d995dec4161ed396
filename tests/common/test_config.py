"""Configuration says the truth: docs/configuration.md documents every LINKESCAPE_* name the source
uses and no other, its plain defaults are config.py's, and every variable config.py reads refuses
bad input with a ConfigError."""

from __future__ import annotations

import ast
import dataclasses
import math
import pathlib
import re

import pytest

from linkescape import config as config_mod
from linkescape.config import Config
from linkescape.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"^LINKESCAPE_[A-Z0-9]+(?:_[A-Z0-9]+)*$")


def documented() -> dict:
    """{section title: [(names, default cells, meaning)]} of the tables in docs/configuration.md."""
    sections, title = {}, None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
        if not line.startswith("| `LINKESCAPE_"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = [n.strip().strip("`") for n in cells[0].split(" / ")]
        defaults = [d.strip() for d in cells[1].split(" / ")] if len(names) > 1 else [cells[1]]
        sections.setdefault(title, []).append((names, defaults, cells[2]))
    return sections


def documented_names() -> list:
    return [n for rows in documented().values() for names, _, _ in rows for n in names]


def names_in_source() -> set:
    """Every string constant in src/ and tools/ that is a whole LINKESCAPE_* name: what the library and its tools
    read (os.environ, getenv, config's table, module constants such as log.LEVEL_VAR) or set for the
    processes they start."""
    found = set()
    for path in [*(ROOT / "src" / "linkescape").rglob("*.py"), *(ROOT / "tools" / "linkescape").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
                found.add(node.value)
    return found


def test_every_name_in_the_source_is_documented_once_and_nothing_else():
    names = documented_names()
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"docs/configuration.md lists these more than once: {twice}"
    source = names_in_source()
    missing, stale = sorted(source - set(names)), sorted(set(names) - source)
    assert not missing, f"the source uses these, docs/configuration.md does not document them: {missing}"
    assert not stale, f"docs/configuration.md documents these, the source never names them: {stale}"


def test_every_variable_config_reads_is_in_the_ranks_table():
    ranks = {n for names, _, _ in documented()["The variables a rank reads"] for n in names}
    assert set(config_mod.ENV_VARS) <= ranks, sorted(set(config_mod.ENV_VARS) - ranks)


def _plain(cell: str):
    """A default cell that is one value (``1800``, ``64M``, ```auto```, ``unset``), else None."""
    text = cell.strip().strip("`")
    return text if re.fullmatch(r"[A-Za-z0-9.\-]+", text) else None


def test_the_documented_defaults_are_configs():
    defaults = Config()
    checked = 0
    for names, cells, meaning in documented()["The variables a rank reads"]:
        for name, cell in zip(names, cells):
            if name not in config_mod._ENV or _plain(cell) is None:
                continue
            field, parse = config_mod._ENV[name]
            want = getattr(defaults, field)
            text = _plain(cell)
            got = None if text == "unset" else parse(text, name)
            assert got == want, f"docs/configuration.md: {name} defaults to {cell}, config.py to {want!r}"
            checked += 1
    assert checked >= 35, checked  # the table's plain defaults are checked, not skipped


def test_the_readme_names_only_documented_variables_with_their_documented_defaults():
    names = set(documented_names())
    text = (ROOT / "README.md").read_text()
    readme = set(re.findall(r"LINKESCAPE_[A-Z0-9_]*[A-Z0-9]", text))
    assert readme <= names, f"README.md names variables docs/configuration.md does not: {sorted(readme - names)}"
    doc_default = {n: d for rows in documented().values() for names_, defaults, _ in rows
                   for n, d in zip(names_, defaults)}
    rows = re.findall(r"^\| `(LINKESCAPE_\w+)` \| ([^|]*) \|", text, re.M)
    assert len(rows) >= 8, rows  # the README's table of the most used variables
    for name, default in rows:
        assert default.strip() == doc_default[name], f"README.md: {name} defaults to {default.strip()!r}, " \
                                                     f"docs/configuration.md to {doc_default[name]!r}"


# ---------------------------------------------------------------- validation of every value

#: a value each kind of parser must refuse
BAD = {
    "seconds": ["x", "-1", "0", "nan", ""],
    "size": ["x", "-1M", "0", "inf", "1T"],
    "count": ["x", "1.5", "0", "-3"],
    "flag": ["maybe", "2", "yes please"],
    "micros": ["x", "-1", "nan", "inf", "1e"],
}
KIND = {
    config_mod._seconds: "seconds", config_mod._millis: "seconds", config_mod._size: "size",
    config_mod._flag: "flag", config_mod._micros: "micros",
}


@pytest.mark.parametrize("var", [v for v in config_mod.ENV_VARS if config_mod._ENV[v][1] in KIND])
def test_a_bad_value_is_a_config_error_naming_the_variable(var):
    for raw in BAD[KIND[config_mod._ENV[var][1]]]:
        if raw == "":
            continue  # empty is unset
        with pytest.raises(ConfigError) as info:
            Config.from_env({var: raw})
        assert var in str(info.value), (var, raw, str(info.value))


@pytest.mark.parametrize("var", ["LINKESCAPE_TREE_RANKS", "LINKESCAPE_TREE_RADIX", "LINKESCAPE_HALVING_RANKS",
                                 "LINKESCAPE_MAX_STASH_FRAMES",
                                 "LINKESCAPE_MAX_UNEXPECTED", "LINKESCAPE_MAX_PENDING_HANDSHAKES"])
def test_a_bad_count_is_a_config_error(var):
    for raw in BAD["count"]:
        with pytest.raises(ConfigError, match=var):
            Config.from_env({var: raw})


def test_a_tree_of_radix_one_is_a_config_error():
    with pytest.raises(ConfigError, match="LINKESCAPE_TREE_RADIX"):
        Config.from_env({"LINKESCAPE_TREE_RADIX": "1"})
    assert Config.from_env({"LINKESCAPE_TREE_RADIX": "2"}).tree_radix == 2
    assert Config().tree_radix == 8


@pytest.mark.parametrize("var,raw", [
    ("LINKESCAPE_PROBE_RATE", "0"), ("LINKESCAPE_PROBE_RATE", "nan"), ("LINKESCAPE_PROBE_RATE", "x"),
    ("LINKESCAPE_METRICS_PORT", "0"), ("LINKESCAPE_METRICS_PORT", "65536"), ("LINKESCAPE_METRICS_PORT", "http"),
    ("LINKESCAPE_TRACE_BUFFER", "-1"), ("LINKESCAPE_TRACE_BUFFER", "many"),
    ("LINKESCAPE_TCP_RTO_MIN_MS", "-1"), ("LINKESCAPE_TCP_RTO_MIN_MS", "nan"), ("LINKESCAPE_TCP_RTO_MIN_MS", "x"),
    ("LINKESCAPE_POLICY", "round-robin"), ("LINKESCAPE_AUTH", "sometimes"),
    ("LINKESCAPE_CONNECT_AT_START", "some"), ("LINKESCAPE_RAILS", ","), ("LINKESCAPE_AUTH_KEY", " "),
    ("LINKESCAPE_METRICS_ADDR", " "), ("LINKESCAPE_CHUNK_BYTES", "100"),
])
def test_other_bad_values_are_config_errors(var, raw):
    with pytest.raises(ConfigError):
        Config.from_env({var: raw})


@pytest.mark.parametrize("var", ["LINKESCAPE_SPIN_US", "LINKESCAPE_YIELD_US"])
def test_spin_and_yield_budgets(var):
    field = config_mod._ENV[var][0]
    assert getattr(Config.from_env({var: "0"}), field) == 0.0
    assert getattr(Config.from_env({var: " 125.5 "}), field) == 125.5
    for raw in BAD["micros"]:
        with pytest.raises(ConfigError, match=var):
            Config.from_env({var: raw})
    with pytest.raises(ConfigError):
        Config(**{field: -1.0})
    with pytest.raises(ConfigError):
        Config(**{field: math.inf})


@pytest.mark.parametrize("raw,want", [("1", True), ("TRUE", True), (" on ", True), ("yes", True),
                                      ("0", False), ("False", False), ("off", False), ("no", False)])
def test_flags(raw, want):
    for var in ("LINKESCAPE_CARRIER_WATCH", "LINKESCAPE_MALLOC_TRIM", "LINKESCAPE_MALLOC_THRESHOLDS",
                "LINKESCAPE_FRAME_AUTH", "LINKESCAPE_EAGER_BACKUPS"):
        assert getattr(Config.from_env({var: raw}), config_mod._ENV[var][0]) is want, (var, raw)


def test_good_values_parse_to_their_units():
    cfg = Config.from_env({"LINKESCAPE_HEARTBEAT_MS": "20", "LINKESCAPE_SILENT_TIMEOUT_MS": "100",
                           "LINKESCAPE_SOCKET_BUFFER": "4MiB", "LINKESCAPE_COPY_BYTES": "16k",
                           "LINKESCAPE_DIRECT_BYTES": "2KB", "LINKESCAPE_CONNECT_TIMEOUT": "60",
                           "LINKESCAPE_PEER_LOST_TIMEOUT": "0.5", "LINKESCAPE_TCP_RTO_MIN_MS": "0"})
    assert (cfg.heartbeat_interval, cfg.silent_timeout) == (0.02, 0.1)
    assert (cfg.socket_buffer, cfg.copy_bytes, cfg.direct_bytes) == (4 << 20, 16 << 10, 2 << 10)
    assert (cfg.connect_timeout, cfg.peer_lost_timeout, cfg.tcp_rto_min) == (60.0, 0.5, 0.0)


def test_every_field_config_reads_exists():
    fields = {f.name for f in dataclasses.fields(Config)}
    assert {field for field, _ in config_mod._ENV.values()} <= fields
