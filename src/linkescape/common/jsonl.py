"""JSON lines, as the tools' processes write and read them.

A record is one line written with one ``write``: a process killed in the
middle leaves at most a torn last line, and several processes may append to
one ``O_APPEND`` file without interleaving. Readers skip what does not parse
(a torn last line, a blank line) and a file that does not exist yet.

* :func:`say`: a record on stdout (a rank reporting to its controller), with
  its wall time ``t``; :func:`emit`: the record alone, after an optional
  prefix (for output mixed with other lines); both thread-safe.
* :func:`write` / :func:`append`: a record on a descriptor / at the end of a file.
* :func:`read` / :class:`Tail`: every record of a file / the records appended since the last read.

Imports nothing of linkescape: every floor may use it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional

_COMPACT = (",", ":")
_say_lock = threading.Lock()


def encode(record: Mapping[str, Any], *, compact: bool = False) -> str:
    """One line (with its newline); ``default=str``: an odd value (an exception, a path) must not lose the record."""
    return json.dumps(record, default=str, separators=_COMPACT if compact else None) + "\n"


def emit(record: Mapping[str, Any], prefix: str = "") -> None:
    """``prefix`` and ``record`` as one line on stdout, flushed."""
    line = prefix + encode(record)
    with _say_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def say(**record: Any) -> None:
    """``record`` (with ``t``, the wall time, unless given) as one line on stdout, flushed."""
    record.setdefault("t", time.time())
    emit(record)


def write(fd: int, record: Mapping[str, Any], *, compact: bool = False) -> None:
    """``record`` as one ``os.write`` on ``fd`` (open it with ``O_APPEND``)."""
    os.write(fd, encode(record, compact=compact).encode())


def append(path: str, record: Mapping[str, Any], *, compact: bool = False) -> None:
    """``record`` at the end of ``path`` (created if missing), in one write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        write(fd, record, compact=compact)
    finally:
        os.close(fd)


def parse(line) -> Optional[Dict[str, Any]]:
    """The record of one line (str or bytes), or None when it is not a JSON object."""
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


class Tail:
    """New complete lines of a file that another process appends to (a torn last line waits for its end)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.buf = b""
        self.records: List[Dict[str, Any]] = []  #: every record read so far

    def read(self) -> List[Dict[str, Any]]:
        """The records appended since the last call."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = [rec for rec in map(parse, lines) if rec is not None]
        self.records.extend(out)
        return out


def read(path: str) -> List[Dict[str, Any]]:
    """Every complete record of ``path`` (none if it does not exist)."""
    return Tail(path).read()


__all__ = ["encode", "emit", "say", "write", "append", "parse", "Tail", "read"]
