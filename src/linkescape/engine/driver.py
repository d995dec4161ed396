"""Who drives progress. A caller that waits for an operation drives the engine
itself (lowest latency); when nobody waits, a background thread does (async
operations, heartbeats, acks, failure detection). Other threads never block
on the engine lock for long: they hand work over (``Engine.call_soon``) or are
let in between two rounds of the driver.

The driver holds the lock every state change of the engine happens under;
nothing else takes it (``locked()`` lets another thread in for a moment).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Callable, Optional, Sequence, TypeVar

from .messages import Op
from .env import INF
from .ports import DriverPort

log = logging.getLogger("linkescape.engine")

T = TypeVar("T")

#: the longest a waiting caller sleeps in one poll (a safety net: timers and deadlines wake it)
MAX_SLEEP = 1.0
#: the longest a driving thread waits, between two rounds, for a thread that asked for the lock to
#: take it (``_let_in``): the hand-over is what makes the lock fair, the bound what keeps a thread
#: that is slow to run from stalling the driver's operation for longer
HANDOVER_WAIT = 0.02


class Driver:
    def __init__(self, engine: DriverPort) -> None:
        self.engine = engine
        #: every state change of the engine happens under this lock
        self.lock = threading.RLock()
        self._drivers = 0
        self._cv = threading.Condition(threading.Lock())
        self._waiters = 0
        #: times a thread that had to wait took the lock (how a driver letting it in knows it did)
        self._turns = 0
        self._thread: Optional[threading.Thread] = None
        #: the progress thread waits here until the rank's start-up is done (see ``start_background``)
        self._gate = threading.Event()
        #: seconds to busy-poll before blocking (0: never)
        self.spin = 0.0
        #: then seconds to poll with ``sched_yield`` in between before blocking (0: never)
        self.yield_for = 0.0
        #: the engine deadline the progress thread sleeps until in its idle poll (INF while it is
        #: about to compute it, 0.0 while it is not in one): a thread that made a round under
        #: ``locked()`` and moved the deadline sooner must wake it
        self._idle_until = 0.0

    # ------------------------------------------------------------ the lock
    def acquire(self) -> None:
        if not self.lock.acquire(blocking=False):
            with self._cv:  # the count is shared between threads
                self._waiters += 1
            try:
                self.engine.io.wake()  # whoever holds it may sit in poll(): make it let go
                self.lock.acquire()
            finally:
                with self._cv:
                    self._waiters -= 1
                    self._turns += 1
                    self._cv.notify_all()

    def _let_in(self) -> None:
        """(lock held once) Let the threads that asked for the lock in between two rounds, and
        take it back after them. The lock is not fair: released for a moment only, it went back
        to the driver whenever the thread waiting for it was not running within that moment, on
        a host with more busy threads than cores round after round (an in-process fault took
        0.75 s to get in while a 4-rank job trained beside other tests). So the driver waits
        until one of them took it, ``HANDOVER_WAIT`` at most."""
        with self._cv:
            turn = self._turns
        self.lock.release()
        if not self.lock._is_owned():  # (held twice, by a callback that waits: nobody can take it)
            with self._cv:
                if self._waiters and self._turns == turn:
                    self._cv.wait(HANDOVER_WAIT)
        self.lock.acquire()

    @contextlib.contextmanager
    def locked(self):
        """Hold the engine lock (a driving thread lets us in between two rounds)."""
        self.acquire()
        try:
            yield self.engine
        finally:
            eng = self.engine
            # a deadline asked for and not yet taken in by a round, or one that a round made here
            # (``fn`` ran ``progress_once``: a frame parked for the stash) moved before the time the
            # progress thread sleeps until
            wanted = eng.timers_wanted() or eng.next_timer < self._idle_until
            self.lock.release()
            if wanted:
                eng.io.wake()  # the thread in poll() computed its sleep before this deadline

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` under the engine lock."""
        with self.locked():
            return fn()

    # ------------------------------------------------------------ operations
    def start(self, op: Op) -> None:
        """Hand an asynchronous op to the engine; the background thread
        drives it until someone waits."""
        self.acquire()
        try:
            self.engine.start_locked(op)
        finally:
            self.lock.release()
        self.engine.io.wake()

    def run(self, op: Op, posted=None) -> None:
        """Start ``op`` and drive it to completion from the calling thread;
        ``posted`` (a held lock) is released once the op is in the engine."""
        with self._cv:
            self._drivers += 1
        try:
            self.acquire()
            try:
                try:
                    self.engine.start_locked(op)
                finally:
                    if posted is not None:
                        posted.release()
                self._drive_locked(op, None)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

    def wait(self, op: Op, timeout: Optional[float] = None) -> bool:
        """Drive progress until ``op`` is done and its completion callbacks have run (they run
        under the lock: once a waiter holds it, a done op is finished); False on timeout."""
        if op.finished:
            return True
        with self._cv:
            self._drivers += 1
        try:
            self.acquire()
            try:
                return self._drive_locked(op, None if timeout is None else self.engine.clock.now() + timeout)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

    def _drive_locked(self, op: Op, end: Optional[float]) -> bool:
        eng = self.engine
        while not op.done:
            if self._waiters:
                # Another thread wants the lock (to post, or to wait on its own
                # op): let it in between two rounds, then make progress anyway.
                self._let_in()
            now = self.engine.clock.now()
            # (the engine's timers and the op's deadline bound the sleep; whoever
            # else wants in wakes the poll)
            left = min(MAX_SLEEP, op.deadline - now) if end is None else min(MAX_SLEEP, end - now)
            if left <= 0:
                if end is None:
                    eng.progress_once(0.0)  # the op's deadline passed: the round times it out
                    continue
                return False
            if op.settle_until is not None:
                left = min(left, max(0.0, op.settle_until - now))
            left = min(left, max(0.0, eng.next_timer - now))
            if self.spin:
                # Poll without sleeping for a few microseconds first: a reply
                # usually comes within a round trip, and waking up from a
                # blocking poll costs more than that. Only when this rank has
                # a core to itself (see Communicator).
                spin_end = now + self.spin
                while not op.done and self.engine.clock.now() < spin_end:
                    eng.progress_once(0.0)
                if op.done:
                    break
            if self.yield_for and left > 0:
                # A core shared with the rank we wait for: hand it over and look again, rather
                # than sleep in poll and be woken (see Communicator._spin_budget).
                clock = self.engine.clock
                yield_end = now + min(self.yield_for, left)
                while True:
                    os.sched_yield()
                    eng.progress_once(0.0)
                    if op.done or self._waiters or clock.now() >= yield_end:
                        break
                if op.done:
                    break
                left -= clock.now() - now
                if self._waiters or left <= 0:
                    continue  # (let it in; or the timers are due: the loop's checks again)
            eng.progress_once(left)
        return True

    def _driver_done(self) -> None:
        with self._cv:
            self._drivers -= 1
            last = not self._drivers
            handover = last and self.engine.async_work()
            if handover:
                self._cv.notify_all()  # hand async work back to the progress thread
        # The progress thread went to sleep in its idle poll before this caller drove (it saw no
        # driver then, and an uncontended lock wakes nobody): a deadline the caller's rounds set
        # before the one it sleeps until would wait for that (a lone ack, a silence check)
        if handover or (last and self.engine.next_timer < self._idle_until):
            self.engine.io.wake()

    # ------------------------------------------------------------ background
    def start_background(self, also: Sequence[Callable[[], None]] = (), gated: bool = False) -> None:
        """Start the progress thread; it first starts ``also`` (the rank's
        other threads: a thread start waits until the new thread runs, which
        on a loaded host is a scheduling round each, off the caller's path).
        ``gated``: the thread waits for ``open_gate`` before it starts them and
        drives anything (the start-up barrier: a rank that arrived early then
        takes no CPU from the ranks still starting, where the beacon's first
        record and the threads' starts cost it ~1 ms of CPU each at 32 ranks
        on 2 cores; see docs/benchmarks.md)."""
        if not gated:
            self._gate.set()
        self._thread = threading.Thread(target=self._background, args=(tuple(also),),
                                        name=f"linkescape-progress-{self.engine.rank}", daemon=True)
        self._thread.start()

    def open_gate(self) -> None:
        """(``start_background(gated=True)``) The progress thread goes on."""
        self._gate.set()

    def _background(self, also=()) -> None:
        """Drive async operations while nobody waits; otherwise tick timers.

        While a caller drives, this thread stays off the lock and off the
        links, so frames wake exactly one thread."""
        self._gate.wait()  # (``close`` opens it too)
        for start in also:
            if self.engine.closed:
                break  # closed before it got going: nothing to start
            try:
                start()
            except Exception:  # noqa: BLE001
                log.exception("a thread of the rank did not start")
        eng = self.engine
        while not eng.closed:
            if self._drivers:
                # A caller drives (and runs the timers): stay out of its way.
                with self._cv:
                    if self._drivers and not eng.closed:
                        self._cv.wait(0.1)
                continue
            if not eng.async_work():
                # (INF first: a round under ``locked()`` that moves the deadline after it is read
                # here sees a sleeper to wake; one that moved it before is read here)
                self._idle_until = INF
                until = self._idle_until = eng.next_timer
                for fd, _ in eng.io.idle_poll(max(0.0, until - self.engine.clock.now())):
                    if eng.io.is_wake(fd):
                        eng.io.drain_wake()
                self._idle_until = 0.0
                if self._drivers or eng.closed:
                    continue
                if self.lock.acquire(blocking=False):
                    try:
                        if not eng.closed and not self._drivers:
                            eng.progress_once(0.0)
                    except Exception as exc:  # noqa: BLE001
                        log.exception("progress failed")
                        eng.set_fatal(exc)
                    finally:
                        self.lock.release()
                continue
            if not self.lock.acquire(timeout=0.05):
                continue
            try:
                if self._waiters:
                    self._let_in()  # (its rounds come back to back: the same hand-over as a caller's)
                if not eng.closed and not self._drivers:
                    eng.progress_once(min(0.01, max(0.0, eng.next_timer - self.engine.clock.now())))
            except Exception as exc:  # noqa: BLE001 - never die silently: fail the ops instead
                log.exception("progress failed")
                eng.set_fatal(exc)
            finally:
                self.lock.release()

    def close(self, graceful: bool = True, drain: float = 10.0) -> None:
        """Close the engine (see ``Engine.close_locked``), then stop the
        background thread and the engine's descriptors."""
        with self.locked() as engine:
            engine.close_locked(graceful, drain)
        self._gate.set()  # a thread still at the gate sees the engine closed and ends
        engine.io.wake()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        engine.close_io()
