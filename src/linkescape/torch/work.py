"""torch ``Work`` objects completed by linkescape's progress engine.

An operation is one or more library operations (``linkescape.Work``, posted
with ``async_op=True``) plus a *finish* step that runs once they all succeed
(copy a staged result back into the caller's tensors). Completion flows like
this:

* the library calls our done-callback on its progress thread, under its
  lock; the callback only counts and, when the last part is in (or one part
  failed), hands the work to the *completer* thread;
* the completer thread (or a caller already blocked in ``wait()``, whichever
  comes first) runs the finish step once and completes the torch future;
  future callbacks (DDP's comm hooks, ``then()``) therefore never run on the
  library's progress thread and may start new operations freely.

A failure is a :class:`LinkEscapeBackendError`, a ``DistBackendError`` that
carries the library's typed error as ``.cause`` (and ``__cause__``).
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import threading
import time
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from ..common.errors import CommTimeout

log = logging.getLogger("linkescape.torch")

#: a waiting caller drives the library in slices this long (seconds)
_SLICE = 0.1


class LinkEscapeBackendError(dist.DistBackendError):
    """A linkescape operation failed. ``cause`` is the library's typed error
    (``PeerLost``, ``LinkFailure``, ``CommTimeout``, ``CollectiveMismatch``,
    ...); ``peer`` the group rank it names, if any; ``global_peer`` that rank
    in the default group."""

    def __init__(self, message: str, cause: Optional[BaseException] = None, *, op: str = "",
                 rank: Optional[int] = None, peer: Optional[int] = None, global_peer: Optional[int] = None,
                 group: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.op = op
        self.rank = rank
        self.peer = peer
        self.global_peer = global_peer
        self.group = group
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self):
        return (_rebuild_error, (str(self), self.op, self.rank, self.peer, self.global_peer, self.group))


def _rebuild_error(message, op, rank, peer, global_peer, group):
    return LinkEscapeBackendError(message, None, op=op, rank=rank, peer=peer, global_peer=global_peer, group=group)


def _peer_of(exc: BaseException) -> Optional[int]:
    peer = getattr(exc, "peer", None)
    if isinstance(peer, int):
        return peer
    peers = getattr(exc, "peers", None)
    if peers:
        return int(peers[0])
    return None


def wrap_error(exc: BaseException, op: str, rank: int, group: str = "",
               global_ranks: Optional[Sequence[int]] = None) -> LinkEscapeBackendError:
    if isinstance(exc, LinkEscapeBackendError):
        return exc
    peer = _peer_of(exc)
    gpeer = None
    where = ""
    if peer is not None:
        if global_ranks and 0 <= peer < len(global_ranks):
            gpeer = int(global_ranks[peer])
        where = f" (peer rank {peer}" + (f", global rank {gpeer}" if gpeer is not None and gpeer != peer else "") + ")"
    gname = f" in group {group!r}" if group else ""
    msg = f"linkescape {op} failed on rank {rank}{gname}{where}: {type(exc).__name__}: {exc}"
    return LinkEscapeBackendError(msg, exc, op=op, rank=rank, peer=peer, global_peer=gpeer, group=group)


# ---------------------------------------------------------------- the completer
class _Completer:
    """One thread per process that finalizes works nobody is waiting for."""

    def __init__(self) -> None:
        self._q: "collections.deque[LinkEscapeWork]" = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="linkescape-torch-completer", daemon=True)
        self.thread.start()

    def submit(self, work: "LinkEscapeWork") -> None:
        with self._cv:
            if self._stop:
                run_now = True
            else:
                self._q.append(work)
                self._cv.notify()
                run_now = False
        if run_now:  # shutting down: nobody else will
            work._finalize()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._stop:
                    self._cv.wait()
                if not self._q:
                    return
                work = self._q.popleft()
            try:
                work._finalize()
            except BaseException:  # noqa: BLE001 - never let the thread die
                log.exception("finalizing %s failed", work)

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)


_completer: Optional[_Completer] = None
_completer_lock = threading.Lock()
_completer_pid = os.getpid()


def completer() -> _Completer:
    global _completer, _completer_pid
    c = _completer
    if c is not None and _completer_pid == os.getpid():
        return c
    with _completer_lock:
        if _completer is None or _completer_pid != os.getpid() or _completer._stop:
            _completer = _Completer()
            _completer_pid = os.getpid()
        return _completer


def stop_completer() -> None:
    global _completer
    with _completer_lock:
        c = _completer
        _completer = None
    if c is not None and _completer_pid == os.getpid():
        c.stop()


def _after_fork_in_child() -> None:
    # the parent's thread does not exist here; start a fresh one if needed
    global _completer
    _completer = None


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- works
class _Part:
    """Adapter giving one of our own works the interface of a library Work
    (so that a coalesced work can be built from works)."""

    __slots__ = ("work",)

    def __init__(self, work: "LinkEscapeWork") -> None:
        self.work = work

    def add_done_callback(self, fn) -> None:
        self.work._listen(lambda _w: fn(self))

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.work._wait_done(timeout)

    def done_within(self, timeout: float) -> bool:
        self.work._wait_done(timeout)
        return self.work._done.is_set()

    def is_completed(self) -> bool:
        return self.work._done.is_set()

    def exception(self):
        return self.work._cause if self.work._done.is_set() else None


class _KeepAlive:
    """Keeps Python work objects alive after torch's C++ took them.

    torch's C++ code may hold a ``Work`` a Python backend returned (DDP keeps
    the forward pass's join allreduce until the backward; functional
    collectives register works until ``wait_tensor``) without holding the
    Python object. Once that object is collected, C++ calls on the handle
    reach the base class: ``wait()`` never returns, ``get_future()`` gives
    nothing. So every work is kept while pending, and the most recent
    completed ones after, oldest out first: works whose outputs are small
    (at most ``small_bytes``: a join's flag, a loss, a metric) up to
    ``max_works`` of them, and apart from them the large ones up to
    ``max_bytes`` of outputs (at least the newest one stays); large ones
    flooding in never push a small one out. What a kept work costs (issue 18):
    the caller's tensors (a job handing fresh 16 MiB tensors to every call kept
    64 MiB of them under the old bound, and RSS stayed 130-230 MB above
    Gloo's), and its small objects in glibc's heap, which sit between the
    job's large fresh buffers and keep their holes from being reused (a gather
    whose root alternates grew about 2 MB a call with 1024 small works kept).
    """

    def __init__(self, max_works: int = 64, max_bytes: int = 8 << 20, small_bytes: int = 4 << 10) -> None:
        self.max_works = max_works
        self.max_bytes = max_bytes
        self.small_bytes = small_bytes
        self._lock = threading.Lock()
        self._pending: set = set()
        self._small: "collections.deque" = collections.deque()
        self._large: "collections.deque" = collections.deque()
        self._bytes = 0

    def pending(self, work: "LinkEscapeWork") -> None:
        with self._lock:
            self._pending.add(work)

    def completed(self, work: "LinkEscapeWork") -> None:
        held = list(work._outputs) + (list(work._value) if isinstance(work._value, (list, tuple)) else [])
        size = sum(t.numel() * t.element_size() for t in held if isinstance(t, torch.Tensor))
        with self._lock:
            self._pending.discard(work)
            if size <= self.small_bytes:
                self._small.append(work)
                while len(self._small) > self.max_works:
                    self._small.popleft()
                return
            self._large.append((work, size))
            self._bytes += size
            while len(self._large) > 1 and (len(self._large) > self.max_works or self._bytes > self.max_bytes):
                _old, old_size = self._large.popleft()
                self._bytes -= old_size

    def kept(self) -> int:
        """Completed works kept now (tests)."""
        with self._lock:
            return len(self._small) + len(self._large)

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()
            self._small.clear()
            self._large.clear()
            self._bytes = 0


_keepalive = _KeepAlive()


class LinkEscapeWork(dist.Work):
    """Handle of one torch.distributed operation over linkescape."""

    def __init__(self, name: str, parts: Sequence, outputs: List[torch.Tensor],
                 finish: Optional[Callable[[], None]] = None, *, rank: int = -1, group: str = "",
                 global_ranks: Optional[Sequence[int]] = None, keep=None, source_rank: int = -1,
                 value: Optional[list] = None) -> None:
        super().__init__()
        self._name = name
        self._parts = list(parts)
        self._outputs = list(outputs)
        self._value = value  # the future's value, when not the outputs
        self._finish = finish
        self._rank = rank
        self._group = group
        self._global_ranks = global_ranks
        self._keep = keep  # staging buffers the library writes into / reads from
        self._src_rank = source_rank  # an int, or a callable asked once complete (any-source recv)
        # the finish step and the future's callbacks run under the caller's
        # grad and inference modes, as at the call (Gloo restores the
        # caller's thread-local state on its worker thread too)
        self._modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        self._future = _new_future(self._outputs)
        self._lock = threading.Lock()
        self._final_lock = threading.RLock()
        self._pending = len(self._parts)
        self._submitted = False
        self._waiters = 0
        self._cause: Optional[BaseException] = None
        self._error: Optional[LinkEscapeBackendError] = None
        self._done = threading.Event()
        self._final_started = False
        self._listeners: List[Callable] = []
        self.started = time.monotonic()
        _keepalive.pending(self)
        if not self._parts:
            self._finalize()
        else:
            for part in self._parts:
                part.add_done_callback(self._part_done)

    # ---- completion (library progress thread)
    def _part_done(self, part) -> None:
        exc = part.exception()
        with self._lock:
            self._pending -= 1
            if exc is not None and self._cause is None:
                self._cause = exc
            if self._submitted or (self._pending > 0 and exc is None):
                return
            self._submitted = True
            if self._waiters:
                return  # a caller blocked in wait() finalizes: no thread hop
        completer().submit(self)

    def _finalize(self) -> None:
        """Run the finish step once, then complete the future (its callbacks
        run here), then mark the work completed; so once ``wait()`` returns
        or ``is_completed()`` is true, the future holds its value."""
        with self._final_lock:
            if self._final_started:
                return  # done, or in progress on this very thread (a callback)
            self._final_started = True
            grad, inference = self._modes
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                self._finalize_locked()

    def _finalize_locked(self) -> None:
        cause = self._cause
        if cause is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as exc:  # noqa: BLE001 - reported through the work
                cause = exc
        if cause is not None:
            self._cause = cause
            self._error = wrap_error(cause, self._name, self._rank, self._group, self._global_ranks)
        self._finish = None
        listeners, self._listeners = self._listeners, []
        for fn in listeners:
            try:
                fn(self)
            except Exception:  # noqa: BLE001
                log.exception("listener of %s failed", self._name)
        try:
            if self._error is not None:
                self._future.set_exception(self._error)
            else:
                self._future.set_result(self._outputs if self._value is None else self._value)
        except Exception:  # noqa: BLE001 - a user callback on the future raised
            log.exception("a callback on the future of %s failed", self._name)
        self._done.set()
        self._keep = None
        # A completed work answers torch from its own fields: the library's parts (and whatever
        # they still reference) are not kept with it.
        src = self._src_rank
        if callable(src):
            try:
                src = src()
            except Exception:  # noqa: BLE001 - a failed any-source receive has no source
                src = None
            self._src_rank = int(src) if src is not None else -1
        self._parts = []
        _keepalive.completed(self)

    def _listen(self, fn) -> None:
        with self._final_lock:
            if not self._final_started:
                self._listeners.append(fn)
                return
        fn(self)

    def _fail(self, exc: BaseException) -> None:
        """Fail from outside (a group member was lost while this collective,
        which needs every member, waits for others)."""
        with self._lock:
            if self._submitted or self._done.is_set():
                return
            if self._cause is None:
                self._cause = exc
            self._submitted = True
        completer().submit(self)

    def _wait_done(self, timeout: Optional[float]) -> bool:
        """Drive progress until done; False on timeout. Never raises the op's error."""
        if self._done.is_set():
            return True
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiters += 1
        try:
            for part in self._parts:
                # in slices, so that a failure from outside (_fail) is seen
                while not part.is_completed() and self._cause is None:
                    left = _SLICE if end is None else min(_SLICE, end - time.monotonic())
                    if left <= 0:
                        break
                    part.done_within(left)  # its error, if any, reaches us through the callback
                if self._cause is not None or (end is not None and time.monotonic() >= end):
                    break
        finally:
            with self._lock:
                self._waiters -= 1
                ready = self._pending == 0 or self._cause is not None
        if ready:
            self._finalize()  # runs the finish here unless the completer already did
            return True
        if end is not None:
            return self._done.wait(max(0.0, end - time.monotonic()))
        # Every part says it is done but its callbacks, which count it in, have not all run (a
        # part that reports completion first; the library's own Work did until Op.finished): as
        # nobody waits now, they hand the work to the completer. Until then, wait on (an infinite
        # wait never times out).
        while not self._done.wait(_SLICE):
            with self._lock:
                ready = self._pending == 0 or self._cause is not None
            if ready:
                self._finalize()
        return True

    # ---- the torch Work API
    def wait(self, timeout=None) -> bool:
        secs = _timeout_seconds(timeout)
        if not self._wait_done(secs):
            raise wrap_error(CommTimeout(f"{self._name} not complete after {secs}s (the operation keeps "
                                         f"running)"), self._name, self._rank, self._group, self._global_ranks)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        # the future completes (its callbacks run) just before _done is set
        return self._done.is_set() or self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error if self.is_completed() else None

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        return self._future

    def get_future_result(self) -> torch.futures.Future:
        return self._future

    def synchronize(self) -> None:
        return None

    def source_rank(self) -> int:
        src = self._src_rank
        if callable(src):
            if not self._done.is_set():
                return -1
            src = src()
            src = int(src) if src is not None else -1
        return src

    def _source_rank(self) -> int:  # torch has both spellings
        return self.source_rank()

    def block_current_stream(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else ("done" if self._done.is_set() else "pending")
        return f"LinkEscapeWork({self._name}, rank={self._rank}, {state})"


def _new_future(outputs: Sequence[torch.Tensor]) -> torch.futures.Future:
    """A future allowed to hold the outputs: torch refuses a value with
    tensors on devices the future was not created for (CUDA)."""
    devices = sorted({str(t.device) for t in outputs
                      if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")})
    return torch.futures.Future(devices=devices) if devices else torch.futures.Future()


def _timeout_seconds(timeout) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    else:
        secs = float(timeout)
    return secs if secs > 0 else None  # 0 is torch's kNoTimeout


def coalesced(name: str, works: Sequence[LinkEscapeWork], **kw) -> LinkEscapeWork:
    """A work that completes when every one of ``works`` has."""
    outputs: List[torch.Tensor] = []
    for w in works:
        outputs.extend(w._outputs)
    return LinkEscapeWork(name, [_Part(w) for w in works], outputs, None, **kw)


__all__ = ["LinkEscapeBackendError", "LinkEscapeWork", "wrap_error", "completer", "stop_completer", "coalesced"]
