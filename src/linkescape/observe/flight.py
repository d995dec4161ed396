"""The flight recorder: the last N operations of a rank, dumped when things go wrong.

Like ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for NCCL. Every operation the
communicator posts takes one slot of a preallocated ring
(``LINKESCAPE_TRACE_BUFFER``, default 2000; 0 turns it off): op, seq, its
signature (dtype, count, reduce op, root), peers, posted / started / done
times, the error, and the last frame it sent to each peer. Recording is a
handful of attribute stores into an existing slot, nothing is formatted
until a dump.

A dump (JSON, one file per rank and occasion) goes to ``LINKESCAPE_TRACE_DIR``
when an operation fails with ``CommTimeout``, ``PeerLost``, ``LinkFailure``
or ``CollectiveMismatch``, when ``Work.wait(timeout)`` gives up, on
``SIGUSR1``, and on ``Communicator.dump_trace()``. Operations still in
flight are dumped with the channel counters of every peer they wait for.
``linkescape trace analyze DIR`` reads the dumps of all ranks.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..common.private import write_private

log = logging.getLogger("linkescape.flight")

FORMAT = "linkescape-trace"
VERSION = 1

#: what each operation's signature fields are (the order ``Communicator`` passes them)
SIG_FIELDS: Dict[str, Tuple[str, ...]] = {
    "all_reduce": ("dtype", "count", "reduce_op"),
    "broadcast": ("dtype", "count", "root"),
    "reduce": ("dtype", "count", "reduce_op", "root"),
    "all_gather": ("dtype", "count"),
    "reduce_scatter": ("dtype", "count", "reduce_op"),
    "all_to_all": ("dtype", "count"),
    "gather": ("dtype", "count", "root"),
    "scatter": ("dtype", "count", "root"),
    "barrier": (),
    "send": ("dtype", "count", "peer", "tag"),
    "recv": ("dtype", "count", "peer", "tag"),
}

#: error class name -> dump reason
TRIGGERS = {"CommTimeout": "timeout", "PeerLost": "peer_lost", "LinkFailure": "link_failure",
            "CollectiveMismatch": "mismatch"}

#: the same reason dumps at most once in this many seconds (a lost peer fails every op at once)
DUMP_THROTTLE_S = 2.0

_POSTED, _STARTED, _DONE, _FAILED = "posted", "started", "done", "failed"
_IN_FLIGHT = (_POSTED, _STARTED)
#: a finished op's slot keeps the peers and frame counts of at most this many
#: peers (an all_to_all of N ranks would otherwise keep N of each, per slot)
KEEP_PEERS = 16


def _bounded_peers(peers):
    if peers is None or len(peers) <= KEEP_PEERS:
        return peers
    return frozenset(sorted(peers)[:KEEP_PEERS])


def _bounded_frames(frames):
    if frames is None or len(frames) <= KEEP_PEERS:
        return frames
    return dict(sorted(frames.items())[:KEEP_PEERS])


class _Slot:
    """One ring entry. It holds its op until the slot is reused: a finished
    op has let go of its messages and buffers (``Op.release``), and its peers
    and frame counts are cut to ``KEEP_PEERS`` as it finishes, so what a slot
    keeps is bounded whatever N and whatever the buffers."""

    __slots__ = ("sig", "posted", "started", "ended", "state", "error", "op", "waiting")

    def __init__(self) -> None:
        self.sig: tuple = ()
        self.posted = 0.0
        self.started = 0.0
        self.ended = 0.0
        self.state = ""
        self.error: Optional[BaseException] = None
        self.op: Any = None
        #: peers a failed op still needed, taken when it failed
        self.waiting: Optional[List[int]] = None


class _Started:
    """Passed to ``Engine.run`` as the post lock: records when the engine took the op."""

    __slots__ = ("lock", "slot")

    def __init__(self, lock) -> None:
        self.lock = lock
        self.slot: Optional[_Slot] = None

    def release(self) -> None:
        s = self.slot
        if s is not None:
            if s.state == _POSTED:
                s.state = _STARTED
                s.started = time.time()
            self.slot = None
        self.lock.release()


def _dtype_name(code: Any) -> Any:
    if not isinstance(code, str):
        return code
    try:
        import numpy as np

        return np.dtype(code).name
    except TypeError:
        return code


class FlightRecorder:
    """The ring of one communicator. ``snapshot``: callable giving
    ``Communicator.snapshot()``; ``events``: its EventLog (for the last events)."""

    def __init__(self, size: int, rank: int, world_size: int, trace_dir: Optional[str] = None,
                 snapshot: Optional[Callable[[], dict]] = None, events=None, job: str = "",
                 rails: Optional[List[str]] = None) -> None:
        if size < 1:
            raise ValueError("a flight recorder needs at least one slot")
        self.size = size
        self.rank = rank
        self.world_size = world_size
        self.trace_dir = trace_dir
        self.snapshot = snapshot
        self.events = events
        self.job = job
        self.rails = list(rails or [])
        #: grows to ``size`` slots as operations come (none made up front: 2,000 empty slots cost every
        #: rank ~8 ms of CPU in the constructor), then each is reused
        self._ring: List[_Slot] = []
        self._next = 0
        self._lock = threading.Lock()
        #: per-op counters for the metrics, read at scrape time: name -> [ops, bytes, seconds]
        self._tally: Dict[str, List[Any]] = {}
        self.errors: Dict[Tuple[str, str], int] = {}
        self.coll_posted = 0
        self.coll_done = 0
        self._itemsize: Dict[Any, int] = {}
        self._last_dump: Dict[str, float] = {}
        self._dumps = 0
        self._threads: List[threading.Thread] = []
        self.closed = False
        self.dump_paths: List[str] = []
        #: the completion callback of every op (one bound method, made once)
        self._on_done = self._done

    # ----------------------------------------------------------- recording
    # Recording is on every operation's path, so it does as little as it can:
    # no lock (``record`` runs under the communicator's post lock, ``_done``
    # under the engine's lock; they touch one slot each, and a slot reused
    # while its op still ran is left alone by that op), no allocation, and
    # what the op carries anyway (seq, name, peers, frames) is read from it
    # when a dump or a scrape asks.
    def record(self, op, sig: tuple, posted: float) -> _Slot:
        """A new operation (called in posting order, under the post lock)."""
        i = self._next
        ring = self._ring
        if i == len(ring):
            ring.append(_Slot())
        s = ring[i]
        self._next = i + 1 if i + 1 < self.size else 0
        s.op = op
        s.sig = sig
        s.posted = posted
        s.started = s.ended = 0.0
        s.state = _POSTED
        s.error = s.waiting = None
        if op.collective:
            self.coll_posted = op.seq
        op.flight = s
        op.callbacks.append(self._on_done)
        return s

    def post_lock(self, lock) -> _Started:
        """A stand-in for the post lock that ``Engine.run`` releases once the op
        is in the engine: set ``.slot`` before each run, and it marks the op started."""
        return _Started(lock)

    def started(self, s: _Slot) -> None:
        if s.state == _POSTED:
            s.state = _STARTED
            s.started = time.time()

    def abandon(self, s: _Slot, exc: BaseException) -> None:
        """The engine refused the op (closed, peer already lost)."""
        op = s.op
        if op is not None and op.flight is s:
            op.flight = None
            s.state = _FAILED
            s.ended = time.time()
            s.error = exc
            self._count(op.name, s.sig, s.posted, s.ended, exc)

    def _done(self, op) -> None:
        s = op.flight
        if s is None:
            return  # recorded already
        op.flight = None
        now = time.time()
        err = op.error
        if len(op.peers) > KEEP_PEERS:  # what the slot keeps of it is bounded (see _Slot)
            op.peers = _bounded_peers(op.peers)
        if len(op.last_seq) > KEEP_PEERS:
            op.last_seq = _bounded_frames(op.last_seq)
        if s.op is op:  # else the ring came round while this op ran
            if not s.started:
                s.started = now
            s.ended = now
            s.state = _DONE if err is None else _FAILED
        if err is None:
            if op.collective and op.seq > self.coll_done:
                self.coll_done = op.seq
            self._count(op.name, s.sig, s.posted, now, None)
            return
        peers = getattr(err, "peers", None)
        waiting = sorted(peers) if peers else _waiting_on(op)
        if s.op is op:
            s.error = err
            s.waiting = waiting[:KEEP_PEERS] if waiting else waiting
        self._count(op.name, s.sig, s.posted, now, err)
        reason = TRIGGERS.get(type(err).__name__) or next(
            (TRIGGERS[c.__name__] for c in type(err).__mro__ if c.__name__ in TRIGGERS), None)
        if reason is not None:
            self._trigger(reason, err)

    def _count(self, name: str, sig: tuple, posted: float, ended: float, err: Optional[BaseException]) -> None:
        t = self._tally.get(name)
        if t is None:
            t = self._tally[name] = [0, 0, 0.0]
        t[0] += 1
        t[1] += self._nbytes(sig)
        t[2] += ended - posted if ended > posted else 0.0
        if err is not None:
            key = (name, type(err).__name__)
            self.errors[key] = self.errors.get(key, 0) + 1

    def _nbytes(self, sig: tuple) -> int:
        if len(sig) < 2 or not isinstance(sig[1], int):
            return 0
        code = sig[0]
        size = self._itemsize.get(code)
        if size is None:
            try:
                import numpy as np

                size = np.dtype(code).itemsize if code != "bfloat16" else 2
            except TypeError:
                size = 0
            self._itemsize[code] = size
        return size * sig[1]

    @property
    def ops(self) -> Dict[str, int]:
        return {name: t[0] for name, t in list(self._tally.items())}

    @property
    def bytes(self) -> Dict[str, int]:
        return {name: t[1] for name, t in list(self._tally.items()) if t[1]}

    @property
    def seconds(self) -> Dict[str, float]:
        return {name: t[2] for name, t in list(self._tally.items())}

    # --------------------------------------------------------------- stats
    def stats(self) -> Dict[str, Any]:
        with self._lock:
            pending = [s.posted for s in list(self._ring) if s.state in _IN_FLIGHT]
            return {"ops": dict(self.ops), "bytes": dict(self.bytes), "seconds": dict(self.seconds),
                    "errors": dict(self.errors), "collective_posted": self.coll_posted,
                    "collective_done": self.coll_done, "oldest_pending_posted": min(pending) if pending else None,
                    "ring_bytes": self.ring_bytes()}

    def ring_bytes(self) -> int:
        """What the ring holds, in bytes (its slots and what finished ops left
        in them: at most ``KEEP_PEERS`` peers each, so the ring is bounded by
        its size, whatever N). Counted when asked (a scrape), never per op."""
        total = sys.getsizeof(self._ring)
        for slot in list(self._ring):
            total += sys.getsizeof(slot) + sys.getsizeof(slot.sig)
            op = slot.op
            if op is not None and slot.state not in _IN_FLIGHT:  # (an op in flight is the engine's)
                total += sys.getsizeof(op) + sys.getsizeof(op.peers) + sys.getsizeof(op.last_seq)
        return total

    # ---------------------------------------------------------------- dump
    def entries(self, channels: Optional[Dict[int, dict]] = None) -> List[Dict[str, Any]]:
        """The ring as plain data, oldest first. ``channels`` (peer -> the
        snapshot's counters) adds progress to the operations in flight."""
        with self._lock:
            order = self._ring[self._next:] + self._ring[:self._next]
            raw = []
            for s in order:
                op, state = s.op, s.state
                if op is None or not state:
                    continue
                live = state in _IN_FLIGHT
                raw.append((op.seq, op.name, op.collective, s.sig, s.posted, s.started, s.ended, state,
                            s.error if s.error is not None else (None if live else op.error),
                            sorted(set(op.peers)), dict(op.last_seq), op if live else None, s.waiting))
        out = []
        for seq, name, coll, sig, posted, started, ended, state, err, peers, frames, op, failed_on in raw:
            e: Dict[str, Any] = {"seq": seq, "op": name, "collective": coll}
            fields = SIG_FIELDS.get(name)
            if fields is not None and len(fields) == len(sig):
                for k, v in zip(fields, sig):
                    e[k] = _dtype_name(v) if k == "dtype" else v
            elif sig:
                e["sig"] = [str(v) for v in sig]
            n = self._nbytes_of(sig)
            if n is not None:
                e["nbytes"] = n
            e.update({"state": state, "posted": posted, "started": started or None, "done": ended or None,
                      "peers": peers, "error": _error_dict(err)})
            progress: Dict[str, Dict[str, Any]] = {str(p): {"last_frame": f} for p, f in frames.items()}
            waiting = _waiting_on(op) if op is not None else failed_on
            if waiting is not None:
                e["waiting_on"] = waiting
                for p in set(peers) | set(waiting):
                    d = progress.setdefault(str(p), {})
                    if channels and p in channels:
                        c = channels[p]
                        d.update({"sent": c.get("sent"), "acked": c.get("acked"), "received": c.get("received")})
            e["progress"] = progress
            out.append(e)
        return out

    @staticmethod
    def _nbytes_of(sig: tuple) -> Optional[int]:
        if len(sig) < 2 or not isinstance(sig[1], int):
            return None
        code = sig[0]
        try:
            import numpy as np

            return (2 if code == "bfloat16" else np.dtype(code).itemsize) * sig[1]
        except TypeError:
            return None

    def build(self, reason: str, error: Optional[BaseException] = None) -> Dict[str, Any]:
        snap = None
        if self.snapshot is not None:
            try:
                snap = self.snapshot()
            except Exception as exc:  # noqa: BLE001 - dump what we have
                log.debug("flight recorder: no snapshot: %s", exc)
        peers = {}
        for p, d in ((snap or {}).get("peers") or {}).items():
            peers[int(p)] = {k: d.get(k) for k in ("sent", "acked", "received", "unacked_bytes", "primary", "active",
                                                   "no_path_s", "lost")}
            peers[int(p)]["links"] = [{k: link.get(k) for k in ("rail", "state", "usable", "active", "failures",
                                                                  "down_cause")} for link in d.get("links") or []]
        recent = []
        if self.events is not None:
            try:
                recent = self.events.recent(100)
            except Exception:  # noqa: BLE001
                recent = []
        with self._lock:
            coll = {"posted": self.coll_posted, "done": self.coll_done}
        return {
            "format": FORMAT, "version": VERSION, "reason": reason, "error": _error_dict(error),
            "rank": self.rank, "world_size": self.world_size, "job": self.job, "rails": self.rails,
            "host": socket.gethostname(), "pid": os.getpid(), "dumped_at": time.time(),
            "buffer": self.size, "last_collective": coll,
            "peers": {str(p): v for p, v in sorted(peers.items())},
            "events": recent,
            "entries": self.entries(peers),
        }

    def _trigger(self, reason: str, error: BaseException) -> None:
        """Dump from a thread of its own: completion callbacks run inside the
        engine, and the dump takes a snapshot, which needs the engine's lock."""
        if not self.trace_dir or self.closed or not self._claim(reason, False):
            return
        t = threading.Thread(target=self._write, args=(reason, error, self.trace_dir),
                             name=f"linkescape-trace-dump-{self.rank}", daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _claim(self, reason: str, force: bool) -> bool:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_dump.get(reason, -1e9) < DUMP_THROTTLE_S:
                return False
            self._last_dump[reason] = now
            return True

    def dump(self, reason: str, error: Optional[BaseException] = None, directory: Optional[str] = None,
             force: bool = False) -> Optional[str]:
        """Write a dump now; returns its path, or None (no directory, or throttled)."""
        directory = directory or self.trace_dir
        if not directory or not self._claim(reason, force):
            return None
        return self._write(reason, error, directory)

    def _write(self, reason: str, error: Optional[BaseException], directory: str) -> Optional[str]:
        with self._lock:
            self._dumps += 1
            n = self._dumps
        try:
            data = self.build(reason, error)
            if not os.path.isdir(directory):
                os.makedirs(directory, 0o700, exist_ok=True)
            tag = (self.job or "nojob")[:8]
            # an unpredictable name (the directory may be shared), written 0600 into a
            # temporary file made exclusively, linked into place: never through a planted link
            path = os.path.join(directory, f"trace-{tag}-rank{self.rank}-{os.getpid()}-{n}-{secrets.token_hex(4)}-"
                                           f"{reason}.json")
            write_private(path, json.dumps(data, default=str, separators=(",", ":")), replace=False)
        except Exception:  # noqa: BLE001 - a dump must never take the job down
            log.exception("flight recorder: dump (%s) failed", reason)
            return None
        log.log(logging.INFO if reason in ("manual", "signal") else logging.WARNING,
                "flight recorder: %s: %d operations dumped to %s", reason, len(data["entries"]), path)
        self.dump_paths.append(path)
        return path

    def wait_dumps(self, timeout: float = 5.0) -> None:
        """Wait for dumps being written (after a failure) to be on disk."""
        with self._lock:
            threads = list(self._threads)
        end = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))

    def close(self) -> None:
        self.wait_dumps()
        self.closed = True
        _signals.remove(self)


def _error_dict(err: Optional[BaseException]) -> Optional[Dict[str, Any]]:
    if err is None:
        return None
    d: Dict[str, Any] = {"type": type(err).__name__, "message": str(err)}
    for k in ("peer", "peers", "op_seq", "rails", "since"):
        v = getattr(err, k, None)
        if v is not None:
            d[k] = list(v) if isinstance(v, tuple) else v
    return d


def _waiting_on(op) -> List[int]:
    """Peers an operation in flight still needs something from (or to)."""
    try:
        peers = {m.peer for m in op.recvs if not m.done}
        peers |= {m.peer for m in op.sends if m.carved < m.nbytes}
        return sorted(peers)
    except (AttributeError, TypeError, RuntimeError):  # the engine's messages changed shape
        return []


# ------------------------------------------------------------------ SIGUSR1
class _Signals:
    """SIGUSR1 dumps every live recorder (in a thread: never in the handler).

    Installed while at least one recorder with a trace directory exists,
    from the main thread only; the previous handler is chained and restored.
    A faulthandler registered for SIGUSR1 (stack dumps) keeps working: it is
    re-registered to chain to us.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: "weakref.WeakSet[FlightRecorder]" = weakref.WeakSet()
        self._installed = False
        self._previous: Any = None
        self._faulthandler = False
        self._threads: List[threading.Thread] = []

    def add(self, rec: FlightRecorder) -> None:
        with self._lock:
            self._live.add(rec)
            if self._installed or threading.current_thread() is not threading.main_thread():
                return
            try:
                import faulthandler

                self._faulthandler = faulthandler.unregister(signal.SIGUSR1)
                self._previous = signal.signal(signal.SIGUSR1, self._handler)
                if self._faulthandler:
                    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
                self._installed = True
            except (ValueError, OSError, RuntimeError) as exc:
                log.debug("flight recorder: no SIGUSR1 handler: %s", exc)

    def remove(self, rec: FlightRecorder) -> None:
        with self._lock:
            self._live.discard(rec)
            if self._live or not self._installed:
                threads, self._threads = self._threads, []
            else:
                threads, self._threads = self._threads, []
                if threading.current_thread() is threading.main_thread():
                    try:
                        import faulthandler

                        if self._faulthandler:
                            faulthandler.unregister(signal.SIGUSR1)
                        if signal.getsignal(signal.SIGUSR1) == self._handler:
                            signal.signal(signal.SIGUSR1, self._previous if self._previous is not None
                                          else signal.SIG_DFL)
                        if self._faulthandler:
                            faulthandler.register(signal.SIGUSR1, all_threads=True)
                        self._installed = False
                    except (ValueError, OSError, RuntimeError):
                        pass
        for t in threads:
            t.join(timeout=5.0)

    def _handler(self, signum, frame) -> None:
        recs = [r for r in list(self._live) if not r.closed and r.trace_dir]
        t = threading.Thread(target=_dump_all, args=(recs,), name="linkescape-trace-dump", daemon=True)
        t.start()
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        prev = self._previous
        if callable(prev):
            prev(signum, frame)


def _dump_all(recs: List[FlightRecorder]) -> None:
    for r in recs:
        r.dump("signal", force=True)


_signals = _Signals()


def watch_signal(rec: FlightRecorder) -> None:
    """Let SIGUSR1 dump ``rec`` (until ``rec.close()``)."""
    if rec.trace_dir:
        _signals.add(rec)


__all__ = ["FlightRecorder", "watch_signal", "SIG_FIELDS", "TRIGGERS", "FORMAT", "VERSION"]
