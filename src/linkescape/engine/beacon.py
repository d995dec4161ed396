"""Liveness through the store (the management network, apart from the rails).

Each rank refreshes a record, ``linkescape/alive/{rank}``, once a second: one
store call, whatever N. That is all a healthy job asks of the store. A peer
that has no path over the rails is judged by its record, read twice a second
only while it has no path: a record that keeps advancing is a live peer that
is cut off (wait for a rail: ``no_path``, then ``LinkFailure`` after the
deadline); a record that stopped advancing for 2.5 beats (and
``LINKESCAPE_PEER_LOST_TIMEOUT``) while the store answers us is a process or
host that is gone (``PeerLost``).

The first rank that fails because a peer is lost records the root cause in
``linkescape/failed``. Ranks with a link to it learn it from ``PEER_LOST``
frames; a rank without a path to some peer also reads the record, so it fails
naming the lost peer, not the rank that told it (which may have exited by
then).

Every record is authenticated: a MAC with a key derived from the job's link
key, over the job, the rank that wrote it and what it says (a liveness record:
its counter and its writer's wall time). With a key set
(``LINKESCAPE_AUTH_KEY``), a store writer who does not hold it cannot forge
a record, move one to another rank's key or another job. What is ignored,
and what it costs (issue 48: a garbage record costs only that record):
- a record that fails its MAC (garbage, forged, another rank's): that read
  only; in a peer's liveness key it also makes that peer's record no
  evidence of its death from then on (its key is being written by someone
  else, who may as well replay its old records), never another peer's;
- a liveness record rolled back below a counter this rank has read: a
  replay; that peer's record is no evidence of its death from then on;
- a liveness record written before this rank last heard from that peer over
  the rails (minus a beat and ``CLOCK_SKEW``): a replay of an old record (a
  dead peer's last record is at most a beat older than the last frame it
  sent), or a skewed clock or a late beacon thread. That peer's record is no
  evidence of its death until a record with a higher counter comes (it moves
  forward: its writer lives, and is trusted again): a replayed old record
  never makes a live, cut-off rank look dead, and a skewed or late writer does
  not turn off store-based death detection for good.
A record that keeps advancing still shows a live peer (genuine records go
through whatever else the store holds); a peer whose record is no evidence
of death waits for the rails (``LINKESCAPE_NO_PATH_TIMEOUT``). What remains
is a writer who does nothing but hold back a cut-off rank's refreshes,
replaying its latest record faster than it writes a new one:
docs/security.md.
Without a key the MAC's key is the per-job secret in the store, which only
keeps out those who cannot read the store (docs/security.md).

Store calls can block (a TCPStore whose host is unreachable), so they run on
this thread only, never under the engine lock. When the store does not
answer, nothing is concluded from it: see ``Liveness``.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from typing import Callable, Dict, Optional, Tuple

log = logging.getLogger("linkescape.beacon")

ALIVE_KEY = "linkescape/alive/{rank}"
FAILED_KEY = "linkescape/failed"

#: seconds between two refreshes of a rank's record (one store call each)
BEAT = 1.0
#: a record unchanged for this many beats is stale
STALE_BEATS = 2.5
#: seconds the hosts' wall clocks may differ (NTP keeps them within milliseconds): a liveness
#: record written more than a beat and this before the last frame heard from its rank is a replay
CLOCK_SKEW = 1.0


def _text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


class RecordKey:
    """MACs of the job's store records: bound to the job, the writer and the content."""

    def __init__(self, link_key: bytes, job: bytes) -> None:
        self.job = bytes(job).rstrip(b"\0")
        self._key = hmac.digest(bytes(link_key), b"linkescape store records\0" + self.job, "sha256")

    def mac(self, *fields) -> str:
        msg = "\0".join(str(f) for f in fields).encode()
        return hmac.digest(self._key, self.job + b"\0" + msg, "sha256").hex()[:32]

    def alive(self, rank: int, counter: int, wall: float = 0.0) -> str:
        """A liveness record: its counter and its writer's wall time (ms)."""
        ms = int(wall * 1000)
        return f"{counter} {ms} {self.mac('alive', rank, counter, ms)}"

    def read_alive(self, rank: int, value: str) -> Optional[Tuple[int, float]]:
        """The counter and wall time of an authentic record of ``rank``, else None."""
        try:
            counter_s, ms_s, mac = value.split(" ", 2)
            counter, ms = int(counter_s), int(ms_s)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self.mac("alive", rank, counter, ms)):
            return None
        return counter, ms / 1000.0

    def failure(self, peer: int, by: int, kind: str, why: str, ts: float) -> str:
        record = {"peer": peer, "by": by, "type": kind, "why": why, "ts": ts}
        record["mac"] = self.mac("failed", peer, by, kind, why, repr(ts))
        return json.dumps(record)

    def read_failure(self, value: str) -> Optional[dict]:
        try:
            record = json.loads(value)
            ok = hmac.compare_digest(str(record["mac"]), self.mac(
                "failed", int(record["peer"]), int(record["by"]), record["type"], record["why"], repr(record["ts"])))
        except (ValueError, TypeError, KeyError):
            return None
        return record if ok else None


class Beacon:
    """``on_record(record)``: an authentic failure record of another rank
    (called from this thread); ``failed()``: whether this rank failed already."""

    def __init__(self, rank: int, store, key: RecordKey, clock, peer_lost_timeout: float,
                 on_record: Callable[[dict], None], failed: Callable[[], bool],
                 interval: Optional[float] = None) -> None:
        self.rank = rank
        self.store = store
        self.key = key
        self.clock = clock
        if interval is None:
            # a job that wants a faster verdict than the default beats faster
            interval = min(BEAT, peer_lost_timeout / 2)
        self.interval = interval
        self.on_record = on_record
        self.failed = failed
        #: store calls made (the store-budget test counts them through the store too)
        self.calls = 0
        self.wakeups = 0
        self._counter = 0
        self._cv = threading.Condition()
        self._closed = False
        #: peers whose record we read: peer -> (highest counter, our time it advanced, our time last read)
        self._seen: Dict[int, Tuple[int, float, float]] = {}
        #: the highest counter read of each peer ever watched (kept across its
        #: watches, so that a rollback to an older record shows; one int per peer
        #: that had no path at some time)
        self._highest: Dict[int, int] = {}
        #: the last record read that the job did not write, or a replay (None while every
        #: record read was authentic and fresh): what the snapshot shows as store_untrusted
        self.tampered: Optional[str] = None
        #: peer -> why its record is no evidence of its death any more (its key held a record
        #: the job did not write, or a replayed one): one entry per such peer
        self.untrusted: Dict[int, str] = {}
        #: peer -> the highest counter of its records that looked replayed by wall time (older
        #: than the last frame heard from it) while watched: a record above it moves forward, so
        #: it is taken (clocks of hosts skew, a beacon thread runs late), the peer is trusted
        #: again and its wall time no longer checked until unwatched (-1)
        self._suspect: Dict[int, int] = {}
        #: peers whose key held a record the job did not write, or rolled back (for good)
        self._forged: set = set()
        #: peer -> our wall time when we last heard from it over the rails (given by ``watch``)
        self._heard: Dict[int, float] = {}
        self._known: set = set()
        self._watch: set = set()
        self._report: Optional[str] = None
        self._reported = threading.Event()
        self._warned: set = set()
        #: last time the store answered us (None: never)
        self.store_ok: Optional[float] = None
        self._thread = threading.Thread(target=self._loop, name=f"linkescape-beacon-{self.rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------ engine side (any thread, no store I/O)
    def watch(self, peer: int, heard: Optional[float] = None) -> None:
        """Start reading ``peer``'s record (it has no path). ``heard``: our
        wall time when a frame of it last arrived (its record cannot be older
        than a beat before that, unless replayed)."""
        with self._cv:
            if heard is not None:
                self._heard[peer] = heard
            if peer not in self._watch:
                self._watch.add(peer)
                self._cv.notify()

    def unwatch(self, peer: int) -> None:
        with self._cv:
            self._watch.discard(peer)
            self._seen.pop(peer, None)
            self._heard.pop(peer, None)
            self._suspect.pop(peer, None)

    def stale_after(self, stale_after: float) -> float:
        """How long a record must stay unchanged while we keep reading it to be called stopped
        (``STALE_BEATS`` beats, and at least ``stale_after``)."""
        return max(stale_after, STALE_BEATS * self.interval)

    def record_age(self, peer: int, now: float) -> Optional[float]:
        """Seconds since we saw ``peer``'s record advance (or first read it), or None when the
        store cannot tell (no answer, no authentic record, a record tampered with)."""
        with self._cv:
            seen = self._seen.get(peer)
            if peer in self.untrusted:
                return None
        if seen is None:
            return None
        _value, changed, read = seen
        if now - read > max(2 * self.interval, 1.0):
            return None
        return now - changed

    def report_failure(self, peer: int, error: BaseException) -> None:
        """Record the root cause of this rank's failure for the others."""
        record = self.key.failure(peer, self.rank, type(error).__name__, str(error), round(self.clock.wall(), 3))
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
        if self._thread.is_alive() and self._thread is not threading.current_thread():
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
                wait = max(0.0, due - self.clock.now())
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
                now = self.clock.now()
                if now >= next_beat:
                    self._beat(key)
                    next_beat = now + self.interval
                if watch and now >= next_read:
                    # only while some peer has no path: what the store says of it
                    next_read = now + self.interval / 2
                    self._read_failed()
                    for peer in watch:
                        self._read_peer(peer)
                self.store_ok = self.clock.now()
            except Exception as exc:  # noqa: BLE001 - the store is best effort, never the data path
                log.debug("rank %d: store not answering: %s", self.rank, exc)
                time.sleep(min(self.interval, 0.2))

    def _beat(self, key: str) -> None:
        self.calls += 1
        self._counter += 1
        self.store.set(key, self.key.alive(self.rank, self._counter, self.clock.wall()))

    def _has(self, key: str) -> bool:
        check = getattr(self.store, "check", None)
        self.calls += 1
        return bool(check([key])) if check is not None else True

    def _distrust(self, what: str, detail: str, peer: Optional[int] = None) -> None:
        """A record the job did not write (or a replayed one) was ignored;
        in ``peer``'s liveness key: that peer's record is no evidence of its
        death from now on (logged once per key)."""
        with self._cv:
            self.tampered = f"{what}: {detail}"
            if peer is not None:
                self.untrusted.setdefault(peer, detail)
        if what not in self._warned:
            self._warned.add(what)
            log.warning("rank %d: ignored a store record that is not authentic or is replayed (%s): %s%s", self.rank,
                        what, detail, f"; rank {peer}'s record is no evidence of its death from now on"
                        if peer is not None else "")

    def _read_peer(self, peer: int) -> None:
        key = ALIVE_KEY.format(rank=peer)
        if peer not in self._known:  # a get would wait for a record that does not exist yet
            if not self._has(key):
                return
            self._known.add(peer)
        self.calls += 1
        raw = _text(self.store.get(key))
        record = self.key.read_alive(peer, raw)
        now = self.clock.now()
        with self._cv:
            old = self._seen.get(peer)
            highest = self._highest.get(peer, 0)
            heard = self._heard.get(peer)
            suspect = self._suspect.get(peer)
            if record is None:
                why = "forged"
                self._forged.add(peer)
            elif record[0] < highest:
                why = f"rolled back from {highest} to {record[0]}"
                self._forged.add(peer)
            elif heard is not None and record[1] < heard - self.interval - CLOCK_SKEW and (
                    suspect is None or 0 <= record[0] <= suspect):
                why = (f"replayed: written {heard - record[1]:.1f}s before the last frame heard from rank {peer} "
                       f"over the rails")
                self._suspect[peer] = record[0]
            else:
                counter = record[0]
                self._highest[peer] = counter
                if suspect is not None and suspect >= 0:  # moved forward: a late writer or a skewed clock
                    self._suspect[peer] = -1
                if peer in self.untrusted and peer not in self._forged:
                    del self.untrusted[peer]
                    log.info("rank %d: rank %d's record moves forward again: evidence of its death again",
                             self.rank, peer)
                    old = None
                if old is None or old[0] != counter:
                    self._seen[peer] = (counter, now, now)
                else:
                    self._seen[peer] = (counter, old[1], now)
                return
        # that read only: the peer's earlier reads stand, other peers' records are not affected
        self._distrust(f"alive/{peer}", why, peer)

    def _read_failed(self) -> None:
        if self.failed() or not self._has(FAILED_KEY):
            return
        self.calls += 1
        raw = _text(self.store.get(FAILED_KEY))
        record = self.key.read_failure(raw)
        if record is None:
            self._distrust("failed", raw[:120])
            return
        if record.get("by") == self.rank:
            return
        self.on_record(record)

    def _write_failure(self, record: str) -> None:
        """The first authentic root cause stays; anything else there (a
        forgery) is overwritten."""
        if self._has(FAILED_KEY):
            self.calls += 1
            if self.key.read_failure(_text(self.store.get(FAILED_KEY))) is not None:
                self._reported.set()
                return
        self.calls += 1
        self.store.set(FAILED_KEY, record)
        self._reported.set()


__all__ = ["Beacon", "RecordKey", "ALIVE_KEY", "FAILED_KEY", "BEAT", "STALE_BEATS", "CLOCK_SKEW"]
