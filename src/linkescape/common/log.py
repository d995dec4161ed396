"""NCCL_DEBUG-like logging for the ``linkescape`` logger tree.

``LINKESCAPE_DEBUG`` = WARN (default) | INFO | DEBUG | TRACE, case-insensitive;
standard logging names (WARNING, ERROR, CRITICAL) and numbers are accepted too.
``LINKESCAPE_DEBUG_FILE`` is a path template like NCCL_DEBUG_FILE: ``%h`` is
the hostname, ``%p`` the pid, and ``{rank}`` the rank. Lines look like NCCL's::

    host:1234:1240 [3] LINKESCAPE INFO connected to rank 4 on 2 rails

Only the ``linkescape`` logger is configured, never the root logger: a library
must not change how the application logs. Propagation to the root is turned
off so an application that also logs to stderr does not print every line twice.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from typing import Mapping, Optional

from .errors import ConfigError
from .private import open_private_file

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

ROOT = "linkescape"
LEVEL_VAR = "LINKESCAPE_DEBUG"
FILE_VAR = "LINKESCAPE_DEBUG_FILE"
DEFAULT_LEVEL = logging.WARNING

_NAMES = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "VERSION": logging.INFO,  # NCCL_DEBUG=VERSION prints the version line only; closest is INFO
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
    "FATAL": logging.CRITICAL,
}

# Names printed in the line, NCCL style (WARN rather than WARNING).
_SHORT = {TRACE: "TRACE", logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN",
          logging.ERROR: "ERROR", logging.CRITICAL: "CRIT"}

_lock = threading.Lock()
_HOSTNAME = socket.gethostname().split(".")[0]


def parse_level(text: Optional[str]) -> int:
    """Parse a LINKESCAPE_DEBUG value; empty or None means WARN."""
    if text is None or not text.strip():
        return DEFAULT_LEVEL
    value = text.strip()
    level = _NAMES.get(value.upper())
    if level is not None:
        return level
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{LEVEL_VAR}={text!r} is not one of WARN, INFO, DEBUG, TRACE or a number") from None
    if number < 0:
        raise ConfigError(f"{LEVEL_VAR}={text!r} must not be negative")
    return number


def expand_log_path(template: str, rank: Optional[int]) -> str:
    """Expand ``%h``, ``%p``, ``{rank}`` (and ``%%``) in a log file template."""
    out = []
    i = 0
    while i < len(template):
        c = template[i]
        if c == "%" and i + 1 < len(template):
            nxt = template[i + 1]
            if nxt in "hp%":
                out.append(_HOSTNAME if nxt == "h" else str(os.getpid()) if nxt == "p" else "%")
                i += 2
                continue
        out.append(c)
        i += 1
    path = "".join(out).replace("{rank}", "unknown" if rank is None else str(rank))
    return os.path.expanduser(path)


class NcclFormatter(logging.Formatter):
    """``hostname:pid:tid [rank] LINKESCAPE LEVEL message``.

    The tid is the kernel thread id (as NCCL prints it and as ``top -H`` shows
    it), read at format time; our handlers format in the emitting thread.
    """

    def __init__(self, rank: Optional[int] = None):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        level = _SHORT.get(record.levelno, record.levelname)
        rank = "-" if self.rank is None else self.rank
        return f"{_HOSTNAME}:{record.process}:{threading.get_native_id()} [{rank}] LINKESCAPE {level} {message}"


class _PrivateFileHandler(logging.FileHandler):
    """A log file opened 0600, never through a symlink, only our own regular
    file (issue 48: root may log into a directory others write)."""

    def _open(self):
        return open_private_file(self.baseFilename, "a", encoding=self.encoding)


def _our_handler(logger: logging.Logger) -> Optional[logging.Handler]:
    for h in logger.handlers:
        if getattr(h, "_linkescape", False):
            return h
    return None


def setup_logging(rank: Optional[int] = None, environ: Optional[Mapping[str, str]] = None,
                  *, stream=None) -> logging.Logger:
    """Configure the ``linkescape`` logger from LINKESCAPE_DEBUG(_FILE).

    Idempotent: calling it again (e.g. once the rank is known) updates level,
    rank and destination of the one handler it owns instead of adding another.
    An invalid LINKESCAPE_DEBUG falls back to WARN with a warning rather than
    failing the job over a logging knob.
    """
    env = os.environ if environ is None else environ
    logger = logging.getLogger(ROOT)
    bad = None
    try:
        level = parse_level(env.get(LEVEL_VAR))
    except ConfigError as exc:
        level, bad = DEFAULT_LEVEL, exc
    template = env.get(FILE_VAR) or None

    with _lock:
        handler = _our_handler(logger)
        if rank is None and handler is not None and isinstance(handler.formatter, NcclFormatter):
            rank = handler.formatter.rank  # a later call without a rank keeps the known one
        path = expand_log_path(template, rank) if template else None
        current = getattr(handler, "_linkescape_path", None) if handler else None
        wanted_stream = stream if stream is not None else sys.stderr
        replace = handler is None or current != path or (
            path is None and getattr(handler, "stream", None) is not wanted_stream)
        if replace:
            if path is not None:
                parent = os.path.dirname(os.path.abspath(path))
                if not os.path.isdir(parent):
                    os.makedirs(parent, 0o700, exist_ok=True)
                new: logging.Handler = _PrivateFileHandler(path, mode="a", encoding="utf-8")
            else:
                new = logging.StreamHandler(wanted_stream)
            new._linkescape = True  # type: ignore[attr-defined]
            new._linkescape_path = path  # type: ignore[attr-defined]
            new.setFormatter(NcclFormatter(rank))
            logger.addHandler(new)
            if handler is not None:
                logger.removeHandler(handler)
                handler.close()
            handler = new
        else:
            fmt = handler.formatter
            if isinstance(fmt, NcclFormatter):
                fmt.rank = rank
        handler.setLevel(logging.NOTSET)
        if logger.level != level:  # (setLevel clears every logger's cache: torch has hundreds)
            logger.setLevel(level)
        logger.propagate = False
    if bad is not None:
        logger.warning("%s; using WARN", bad)
    return logger


def get_logger(name: Optional[str] = None) -> logging.Logger:
    """A logger under ``linkescape``: ``get_logger("transport")`` or a module ``__name__``."""
    if not name or name == ROOT:
        return logging.getLogger(ROOT)
    if name.startswith(ROOT + "."):
        return logging.getLogger(name)
    return logging.getLogger(f"{ROOT}.{name}")


def trace(logger: logging.Logger, msg: str, *args, **kwargs) -> None:
    """Log at TRACE; cheap when disabled."""
    if logger.isEnabledFor(TRACE):
        logger.log(TRACE, msg, *args, **kwargs)


__all__ = ["TRACE", "parse_level", "expand_log_path", "setup_logging", "get_logger", "trace",
           "NcclFormatter", "LEVEL_VAR", "FILE_VAR"]
