"""Liveness through the store (the management network, apart from the rails).

Each rank refreshes a record, ``linkescape/alive/{rank}``, once a second
(one store call: a counter it adds 1 to). That is all a healthy job asks of
the store: one call per rank per second, whatever N. A peer that has no path
over the rails is judged by its record, read twice a second only while it
has no path: a record that keeps changing is a live peer that is cut off
(wait for a rail: ``no_path``, then ``LinkFailure`` after the deadline); a
record that stopped changing for 2.5 beats (and ``LINKESCAPE_PEER_LOST_TIMEOUT``)
while the store answers us is a process or host that is gone (``PeerLost``).

The first rank that fails because a peer is lost records the root cause in
``linkescape/failed``. Ranks with a link to it learn it from ``PEER_LOST``
frames; a rank without a path to some peer also reads the record, so it fails
naming the lost peer, not the rank that told it (which may have exited by
then).

Store calls can block (a TCPStore whose host is unreachable), so they run on
this thread only, never under the engine lock. When the store does not
answer, nothing is concluded from it: see ``Liveness``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Dict, Optional, Tuple

if TYPE_CHECKING:
    from .core import Engine

log = logging.getLogger("linkescape.beacon")

ALIVE_KEY = "linkescape/alive/{rank}"
FAILED_KEY = "linkescape/failed"


def _text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


#: seconds between two refreshes of a rank's record (one store call each)
BEAT = 1.0
#: a record unchanged for this many beats is stale
STALE_BEATS = 2.5


class Beacon:
    def __init__(self, engine: "Engine", store, interval: Optional[float] = None) -> None:
        self.engine = engine
        self.store = store
        self.rank = engine.rank
        if interval is None:
            # a job that wants a faster verdict than the default beats faster
            interval = min(BEAT, engine.config.peer_lost_timeout / 2)
        self.interval = interval
        #: store calls made (the store-budget test counts them through the store too)
        self.calls = 0
        self.wakeups = 0
        self._counter = 0
        self._cv = threading.Condition()
        self._closed = False
        #: peers whose record we read: peer -> (last value, our time it changed, our time last read)
        self._seen: Dict[int, Tuple[Optional[str], float, float]] = {}
        self._watch: set = set()
        self._report: Optional[str] = None
        self._reported = threading.Event()
        #: last time the store answered us (None: never)
        self.store_ok: Optional[float] = None
        self._thread = threading.Thread(target=self._loop, name=f"linkescape-beacon-{self.rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine side (any thread, no store I/O)
    def watch(self, peer: int) -> None:
        """Start reading ``peer``'s record (it has no path)."""
        with self._cv:
            if peer not in self._watch:
                self._watch.add(peer)
                self._cv.notify()

    def unwatch(self, peer: int) -> None:
        with self._cv:
            self._watch.discard(peer)
            self._seen.pop(peer, None)

    def verdict(self, peer: int, stale_after: float, now: float) -> Optional[bool]:
        """True: the peer refreshes its record (alive); False: the record
        stopped changing for ``stale_after`` seconds while we kept reading it
        (gone); None: the store cannot tell (no answer, no record, too soon)."""
        with self._cv:
            seen = self._seen.get(peer)
        if seen is None or seen[0] is None:
            return None
        _value, changed, read = seen
        if now - read > max(2 * self.interval, 1.0):
            return None  # our reads stalled: the store (or this thread) is not answering
        return now - changed <= max(stale_after, STALE_BEATS * self.interval)

    def report_failure(self, peer: int, error: BaseException) -> None:
        """Record the root cause of this rank's failure for the others."""
        record = json.dumps({"peer": peer, "by": self.rank, "type": type(error).__name__,
                             "why": str(error), "ts": time.time()})
        with self._cv:
            if self._report is None:
                self._report = record
                self._cv.notify()

    def wait_reported(self, timeout: float) -> bool:
        """Give the root-cause record a moment to reach the store before the
        caller sees the error (and may exit)."""
        with self._cv:
            if self._report is None:
                return False
        return self._reported.wait(timeout)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    # ------------------------------------------------------------ the thread
    def _loop(self) -> None:
        key = ALIVE_KEY.format(rank=self.rank)
        next_beat = 0.0
        next_read = 0.0
        while True:
            with self._cv:
                if self._closed and (self._report is None or self._reported.is_set()):
                    return
                due = next_beat if not self._watch else min(next_beat, next_read)
                wait = max(0.0, due - time.monotonic())
                if (self._report is None or self._reported.is_set()) and not self._closed and wait > 0:
                    self._cv.wait(wait)
                self.wakeups += 1
                if self._closed and (self._report is None or self._reported.is_set()):
                    return
                watch = sorted(self._watch)
                report = self._report if not self._reported.is_set() else None
            try:
                if report is not None:
                    self._write_failure(report)
                now = time.monotonic()
                if now >= next_beat:
                    self._beat(key)
                    next_beat = now + self.interval
                if watch and now >= next_read:
                    # only while some peer has no path: what the store says of it
                    next_read = now + self.interval / 2
                    self._read_failed()
                    for peer in watch:
                        self._read_peer(peer)
                self.store_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the store is best effort, never the data path
                log.debug("rank %d: store not answering: %s", self.rank, exc)
                time.sleep(min(self.interval, 0.2))

    def _beat(self, key: str) -> None:
        self.calls += 1
        add = getattr(self.store, "add", None)
        if add is not None:
            add(key, 1)  # one call; the value is a counter that only grows
        else:
            self._counter += 1
            self.store.set(key, f"{self._counter} {time.time():.3f}")

    def _has(self, key: str) -> bool:
        check = getattr(self.store, "check", None)
        self.calls += 1
        return bool(check([key])) if check is not None else True

    def _read_peer(self, peer: int) -> None:
        key = ALIVE_KEY.format(rank=peer)
        add = getattr(self.store, "add", None)
        if add is not None:
            self.calls += 1
            count = int(add(key, 0))  # one call, never blocks; 0: no record yet
            value = str(count) if count else None
        else:
            value = _text(self.store.get(key)) if self._has(key) else None
        now = time.monotonic()
        with self._cv:
            old = self._seen.get(peer)
            if old is None or old[0] != value:
                self._seen[peer] = (value, now, now)
            else:
                self._seen[peer] = (value, old[1], now)

    def _read_failed(self) -> None:
        if self.engine.fatal is not None or not self._has(FAILED_KEY):
            return
        try:
            record = json.loads(_text(self.store.get(FAILED_KEY)))
        except (ValueError, TypeError):
            return
        if record.get("by") == self.rank:
            return
        self.engine.call_soon(lambda: self.engine.liveness.root_cause(record))

    def _write_failure(self, record: str) -> None:
        if not self._has(FAILED_KEY):
            self.store.set(FAILED_KEY, record)
        self._reported.set()
