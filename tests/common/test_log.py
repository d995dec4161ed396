"""Tests of NCCL_DEBUG-like logging."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import threading

import pytest

from linkescape.errors import ConfigError
from linkescape.log import TRACE, expand_log_path, get_logger, parse_level, setup_logging

LINE = re.compile(r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<rank>[^\]]+)\] LINKESCAPE (?P<lvl>\w+) (?P<msg>.*)$")


@pytest.fixture(autouse=True)
def restore_logger():
    logger = logging.getLogger("linkescape")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for h in list(logger.handlers):
        if h not in saved[0]:
            logger.removeHandler(h)
            h.close()
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.mark.parametrize("text,level", [
    (None, logging.WARNING), ("", logging.WARNING), ("WARN", logging.WARNING), ("warn", logging.WARNING),
    ("Warning", logging.WARNING), ("INFO", logging.INFO), ("info", logging.INFO), ("DEBUG", logging.DEBUG),
    ("trace", TRACE), ("TRACE", 5), ("ERROR", logging.ERROR), ("critical", logging.CRITICAL),
    ("10", 10), (" 20 ", 20), ("5", 5),
])
def test_parse_level(text, level):
    assert parse_level(text) == level


@pytest.mark.parametrize("text", ["LOUD", "-1", "1.5"])
def test_parse_level_invalid(text):
    with pytest.raises(ConfigError):
        parse_level(text)


def test_format_and_idempotent():
    buf = io.StringIO()
    setup_logging(3, {"LINKESCAPE_DEBUG": "info"}, stream=buf)
    logger = setup_logging(3, {"LINKESCAPE_DEBUG": "info"}, stream=buf)
    assert sum(getattr(h, "_linkescape", False) for h in logger.handlers) == 1
    assert logger.propagate is False
    get_logger("transport").info("connected to rank %d", 4)
    get_logger("linkescape.events").warning("link down")
    get_logger("transport").debug("hidden at INFO")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2, lines  # no duplicate
    m = LINE.match(lines[0])
    assert m, lines[0]
    assert m["host"] == socket.gethostname().split(".")[0]
    assert int(m["pid"]) == os.getpid() and int(m["tid"]) == threading.get_native_id()
    assert (m["rank"], m["lvl"], m["msg"]) == ("3", "INFO", "connected to rank 4")
    assert LINE.match(lines[1])["lvl"] == "WARN"


def test_trace_level_and_rank_unknown():
    buf = io.StringIO()
    setup_logging(None, {"LINKESCAPE_DEBUG": "TRACE"}, stream=buf)
    get_logger("x").log(TRACE, "very chatty")
    m = LINE.match(buf.getvalue().strip())
    assert m and m["rank"] == "-" and m["lvl"] == "TRACE"
    # a later call learns the rank, a call after that without one keeps it
    setup_logging(7, {"LINKESCAPE_DEBUG": "TRACE"}, stream=buf)
    setup_logging(None, {"LINKESCAPE_DEBUG": "TRACE"}, stream=buf)
    get_logger("x").info("now ranked")
    assert LINE.match(buf.getvalue().splitlines()[-1])["rank"] == "7"


def test_default_warn_and_invalid_falls_back():
    buf = io.StringIO()
    logger = setup_logging(0, {}, stream=buf)
    assert logger.level == logging.WARNING
    get_logger("x").info("not shown")
    assert buf.getvalue() == ""
    logger = setup_logging(0, {"LINKESCAPE_DEBUG": "shout"}, stream=buf)
    assert logger.level == logging.WARNING
    assert "LINKESCAPE_DEBUG" in buf.getvalue()


def test_debug_file(tmp_path):
    template = str(tmp_path / "logs" / "%h.%p.{rank}.log")
    setup_logging(2, {"LINKESCAPE_DEBUG": "INFO", "LINKESCAPE_DEBUG_FILE": template})
    get_logger("x").info("to the file")
    host = socket.gethostname().split(".")[0]
    path = tmp_path / "logs" / f"{host}.{os.getpid()}.2.log"
    assert path.exists()
    assert "LINKESCAPE INFO to the file" in path.read_text()
    assert expand_log_path("a%%b-%p", None) == f"a%b-{os.getpid()}"
    assert expand_log_path("r{rank}", None) == "runknown"
