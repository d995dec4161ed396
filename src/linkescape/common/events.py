"""The event trail: one JSON line per link event, per rank.

Every link state change a rank observes (a rail going down, traffic moving to
another rail, the rail coming back, no path left, the peer gone) is recorded
here. The trail is a contract read by tests, the CLI and operators, so event
and cause names are fixed strings and unknown ones are rejected at the call
site rather than written.

The file is written with one ``os.write`` per line on an ``O_APPEND`` file
descriptor: nothing sits in a user-space buffer (a crash or SIGKILL loses no
event), and several processes may share one file without interleaving lines.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional

from . import jsonl
from .private import open_private

# ----------------------------------------------------------------- contract
LINK_DOWN = "link_down"
FAILOVER = "failover"
LINK_UP = "link_up"
FAILBACK = "failback"
NO_PATH = "no_path"
PEER_LOST = "peer_lost"
RELAY_ON = "relay_on"    # no rail to the peer: its traffic goes through ``via``
RELAY_OFF = "relay_off"  # not through ``via`` any more (``cause`` says why)
SHRINK = "shrink"        # the group left ranks out (``excluded``, ``old_size``, ``new_size``, ``duration_s``)
EVENTS = (LINK_DOWN, FAILOVER, LINK_UP, FAILBACK, NO_PATH, PEER_LOST, RELAY_ON, RELAY_OFF, SHRINK)

CARRIER = "carrier"            # our own NIC lost carrier (netlink)
PEER_CARRIER = "peer_carrier"  # the peer told us its NIC lost carrier
SOCKET_ERROR = "socket_error"  # send/recv failed (RST, EPIPE, EHOSTUNREACH, ...)
TIMEOUT = "timeout"            # nothing heard for the silent timeout
PROTOCOL_ERROR = "protocol_error"  # the link carried a frame that breaks the protocol
DEGRADED = "degraded"          # carrier up, but goodput stayed below half its healthy rate
# why a relay ended (relay_off, and the no_path that may follow it)
PATH_BACK = "path_back"        # a rail to the peer is back (past its hold-down)
UNREACHABLE = "unreachable"    # the relay said it cannot reach the peer
VIA_LOST = "via_lost"          # the relay itself is out of reach
CAUSES = (CARRIER, PEER_CARRIER, SOCKET_ERROR, TIMEOUT, PROTOCOL_ERROR, DEGRADED, PATH_BACK, UNREACHABLE,
          VIA_LOST)

#: fields every record has, in this order
FIELDS = ("ts", "rank", "event", "peer", "rail", "cause")

ENV_VAR = "LINKESCAPE_EVENTS"

_WARNING_EVENTS = frozenset((LINK_DOWN, NO_PATH, PEER_LOST, RELAY_ON))

logger = logging.getLogger("linkescape.events")

Callback = Callable[[Dict[str, Any]], None]


def expand_path(template: str, rank: int) -> str:
    """Substitute ``{rank}`` in an events path template.

    Plain ``str.replace``, not ``str.format``: a path may contain other braces.
    """
    return os.path.expanduser(template.replace("{rank}", str(rank)))


class EventLog:
    """Records link events of one rank: JSON lines file, logging, memory, callbacks.

    ``path_template`` (usually ``$LINKESCAPE_EVENTS``) may contain ``{rank}``;
    None disables the file but events are still logged, kept and dispatched.

    Callbacks run synchronously inside ``emit``, under the log's (re-entrant)
    lock, so every subscriber sees events in the same order as the file. They
    must be quick and must not wait for another thread that emits.
    """

    def __init__(self, rank: int, path_template: Optional[str] = None, *, keep: int = 1024):
        self.rank = int(rank)
        self.path: Optional[str] = expand_path(path_template, self.rank) if path_template else None
        self._lock = threading.RLock()
        self._recent: Deque[Dict[str, Any]] = collections.deque(maxlen=keep)
        self._subscribers: List[Callback] = []
        self._fd: Optional[int] = None
        if self.path:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                os.makedirs(parent, 0o700, exist_ok=True)
            # 0600, never through a symlink, only a regular file of ours (issue 48)
            self._fd = open_private(self.path, "a")

    @classmethod
    def from_env(cls, rank: int, environ: Optional[Mapping[str, str]] = None, **kwargs) -> "EventLog":
        env = os.environ if environ is None else environ
        return cls(rank, env.get(ENV_VAR) or None, **kwargs)

    # ---------------------------------------------------------------- emit
    def emit(self, event: str, *, peer: Optional[int], rail: Optional[int],
             cause: Optional[str] = None, ts: Optional[float] = None, **extra: Any) -> Dict[str, Any]:
        """Record one event and return the record (a new dict).

        ``rail`` is the index in this rank's rail list; for ``failover`` and
        ``failback`` it is the rail that now carries the traffic (pass
        ``from_rail=`` for the one left). ``ts`` defaults to now (unix seconds).
        """
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; expected one of {EVENTS}")
        if cause is not None and cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}; expected one of {CAUSES}")
        clash = set(extra).intersection(FIELDS)
        if clash:
            raise ValueError(f"extra fields {sorted(clash)} would overwrite the standard ones")
        record: Dict[str, Any] = {
            "ts": float(time.time() if ts is None else ts),
            "rank": self.rank,
            "event": event,
            "peer": peer,
            "rail": rail,
            "cause": cause,
        }
        record.update(extra)
        # default=str: an odd extra (an exception, a Path) must not lose the event
        line = jsonl.encode(record, compact=True).encode()
        with self._lock:
            if self._fd is not None:
                try:
                    os.write(self._fd, line)
                except OSError:
                    logger.exception("cannot write event to %s", self.path)
            self._recent.append(record)
            self._log(record, extra)
            for fn in list(self._subscribers):
                try:
                    fn(dict(record))
                except Exception:
                    logger.exception("event subscriber %r failed", fn)
        return dict(record)

    def _log(self, record: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        level = logging.WARNING if record["event"] in _WARNING_EVENTS else logging.INFO
        if not logger.isEnabledFor(level):
            return
        tail = "".join(f" {k}={v}" for k, v in extra.items())
        logger.log(level, "event %s peer=%s rail=%s cause=%s%s",
                   record["event"], record["peer"], record["rail"], record["cause"], tail)

    # ------------------------------------------------------- subscriptions
    def subscribe(self, fn: Callback) -> Callback:
        """Call ``fn(record)`` for every later event; returns ``fn``."""
        with self._lock:
            self._subscribers.append(fn)
        return fn

    def unsubscribe(self, fn: Callback) -> None:
        with self._lock:
            try:
                self._subscribers.remove(fn)
            except ValueError:
                pass

    def recent(self, n: Optional[int] = None) -> List[Dict[str, Any]]:
        """The last ``n`` (default: all kept) events, oldest first, as copies."""
        with self._lock:
            items = list(self._recent)
        if n is not None:
            items = items[-n:] if n > 0 else []
        return [dict(r) for r in items]

    # ------------------------------------------------------------- closing
    def close(self) -> None:
        """Close the file; later events are still logged, kept and dispatched."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._fd is not None:
                os.close(self._fd)
        except Exception:
            pass


def read_events(path: str) -> List[Dict[str, Any]]:
    """Parse an events file (for tests and the CLI); skips a torn last line."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return jsonl.read(path)


__all__ = [
    "EventLog", "read_events", "expand_path", "EVENTS", "CAUSES", "FIELDS", "ENV_VAR",
    "LINK_DOWN", "FAILOVER", "LINK_UP", "FAILBACK", "NO_PATH", "PEER_LOST",
    "RELAY_ON", "RELAY_OFF",
    "CARRIER", "PEER_CARRIER", "SOCKET_ERROR", "TIMEOUT", "PROTOCOL_ERROR", "DEGRADED", "PATH_BACK", "UNREACHABLE",
    "VIA_LOST",
]
