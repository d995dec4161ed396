"""``ProcessGroupLinkescape``: torchft's reconfigurable process group over linkescape.

Modelled on torchft's ``ProcessGroupGloo``: ``configure`` (at every quorum)
aborts the previous group and builds a :class:`ProcessGroupLinkEscape` from a
store client of the quorum's prefixed store address; every collective goes
to it through torchft's ``ProcessGroupWrapper``.

What differs from torchft's Gloo group:

* ``abort()`` fails every call in flight at once (the library's pending
  operations end with an error; the torch works of the group are failed
  first, so a caller blocked in ``wait()`` returns within milliseconds);
* ``errored()`` reports a rank the group lost (its process ended, or every
  path to it is gone) without waiting for a call to time out: torchft's
  Manager then discards the step and its next quorum leaves the rank out;
* ``set_timeout()`` applies to the live group too, not only to the next
  ``configure``;
* a ``wait()`` that times out aborts the group before it raises (as torchft's
  NCCL group does on a timeout): the operation, which still owns the
  caller's tensors (zero-copy on CPU), can write nothing into them later,
  when a path returns or a late peer joins, e.g. into the next step's
  gradients while torchft's asynchronous quorum has not yet aborted the
  group; ``errored()`` reports it until the next ``configure``;
* faults that leave a path (a cable, an optic, a flap) never reach torchft:
  the group escapes to another rail, and no call fails.

A new quorum keeps the links to the replicas that stay: when its members are
all in the current group, in the same order, and only ranks left out are
known gone, ``configure`` shrinks the current group (``Communicator.shrink``:
no handshake, no new sockets) instead of building one; every member decides
the same from offers it reads in the quorum's store (``reuse``). A replica
that joins or comes back, or a group that was aborted, gets a new group, as
Gloo's does (docs/torchft.md: the time each takes, against Gloo's).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store, TCPStore, Work
from torchft.process_group import ProcessGroupWrapper

from ..common.config import Config
from ..common.errors import CommClosed, CommTimeout, LinkEscapeError, PeerLost, RendezvousError
from ..torch.convert import seconds
from ..torch.process_group import ProcessGroupLinkEscape, make_config
from ..torch.work import LinkEscapeBackendError
from . import reuse

log = logging.getLogger("linkescape.torchft")

BACKEND_NAME = "torchft-linkescape"


class ProcessGroupLinkescape(ProcessGroupWrapper):
    """A torchft process group whose every quorum is a linkescape group.

    ``timeout``: the store's and each call's timeout (torchft's meaning);
    ``config``: the linkescape :class:`~linkescape.config.Config` (default:
    the ``LINKESCAPE_*`` environment); ``rails``: the rails' interface names
    or addresses (default ``LINKESCAPE_RAILS``, else the interface that
    reaches the store's host); ``reuse``: a quorum of replicas that all stay
    shrinks the current group instead of building one (``False``: every
    quorum builds its group, as Gloo's does).
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), *, config: Optional[Config] = None,
                 rails: Optional[Sequence[str]] = None, reuse: bool = True) -> None:
        super().__init__(timeout=timeout)
        self._config = config
        self._rails = list(rails) if rails else None
        self._reuse = bool(reuse)
        #: the store address the current group was built from (every member's is the same)
        self._group_addr: Optional[str] = None
        #: how the last configure got its group: "shrunk" (the links kept) or "built"
        self.last_configure: Optional[str] = None
        #: ("host:port", client): the store connection of the last quorum, kept for the next quorum
        #: at the same address (a new connection to a TCPStore takes 5 s now and then)
        self._store_client: Optional[tuple] = None
        self._lock = threading.Lock()
        self._aborted: Optional[BaseException] = None  # why the current group was aborted
        #: (group, error): a wait() timed out on that group and aborted it (errored() reports it)
        self._timed_out: Optional[tuple] = None

    # ------------------------------------------------------------ torchft's hooks
    def _create_pg(self, store: Store, rank: int, world_size: int) -> ProcessGroupLinkEscape:
        timeout_s = seconds(self._timeout)
        ranks = self._global_ranks if self._global_ranks and len(self._global_ranks) == world_size else None
        name = f"torchft_quorum_{self._quorum_id}" if self._quorum_id is not None else "torchft"
        try:
            pg = ProcessGroupLinkEscape(store, rank, world_size, timeout=self._timeout, group_name=name,
                                        global_ranks=ranks, config=make_config(timeout_s, self._config),
                                        rails=self._rails)
        except LinkEscapeBackendError as exc:
            if "CommTimeout" in str(exc) or "RendezvousError" in str(exc):
                # torchft's tests and callers recognise Gloo's words for a store that never filled
                raise LinkEscapeBackendError(f"{exc} (timeout after {timeout_s * 1e3:.0f}ms)", exc.cause,
                                             op="configure", rank=rank, group=name) from exc
            raise
        with self._lock:
            self._aborted = None
            self._timed_out = None  # (the group a wait aborted is gone with the quorum)
        return pg

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _wrap_work(self, work: Work, opts: object) -> Work:
        return _Work(work, seconds(self._timeout), self._pg, self._abort_on_timeout)

    def _abort_on_timeout(self, pg: object, exc: "LinkEscapeBackendError") -> None:
        """A ``wait()`` on ``pg``'s work timed out while the operation still runs: abort ``pg`` (its
        operations fail, its links close) so that nothing is written into the caller's tensors later.
        The wrapper keeps the aborted group until the next ``configure``: later calls fail with
        ``CommClosed`` and ``errored()`` returns ``exc``."""
        if not isinstance(pg, ProcessGroupLinkEscape):
            return
        with self._lock:
            if pg is self._pg and self._timed_out is None:
                self._timed_out = (pg, exc)
        log.warning("rank %d: %s; aborting the group so that the operation writes nothing later", pg._le_rank, exc)
        with pg._state_lock:
            works = list(pg._inflight.values())
        why = CommClosed(f"process group aborted: a wait timed out (quorum {self._quorum_id})")
        for w in works:
            w._fail(why)
        pg.abort()  # the engine closes under its lock: no library operation of pg runs after this

    @contextmanager
    def _run_context(self):
        # a call refused at once (a lost rank, a closed group) raises in torchft's words too
        try:
            yield
        except LinkEscapeBackendError as exc:
            _reraise(exc)

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: Optional[int] = None, group_rank: Optional[int] = None,
                  group_world_size: Optional[int] = None, global_ranks: Optional[list] = None) -> None:
        """The quorum's group: the current one shrunk when every member stays in order (its calls in
        flight fail with ``GroupShrunk``), else a new one (the current one aborted first)."""
        old = self._pg
        self._replica_id, self._quorum_id, self._rank = replica_id, quorum_id, rank
        self._group_rank, self._group_world_size, self._global_ranks = group_rank, group_world_size, global_ranks
        store = self._store(store_addr)
        out = self._agree(store, old, rank, world_size) if self._reuse else None
        if out is not None:
            try:
                new = old._shrink(out, getattr(dist.distributed_c10d, "SHRINK_ABORT", 1))
            except (LinkEscapeBackendError, LinkEscapeError) as exc:
                # the others shrank: this member fails this quorum (torchft discards the step); its group is
                # closed, so its next offer is none and the next quorum builds a new group everywhere
                self.abort(errored=True)
                raise LinkEscapeBackendError(f"configure could not shrink the group: {exc}", exc, op="configure",
                                             rank=rank) from exc
            assert new._le_rank == rank, (new._le_rank, rank)  # (reuse.excluded keeps the order)
            new._group_name = f"torchft_quorum_{quorum_id}" if quorum_id is not None else "torchft"
            new.set_timeout(self._timeout)
            with self._lock:
                self._pg = new
                self._aborted = None
                self._timed_out = None
            self._group_addr = store_addr
            self.last_configure = "shrunk"
            log.info("rank %d: quorum %s keeps the links: old ranks %s left out", rank, quorum_id, out)
            return
        self.abort(errored=False)
        self._pg = self._create_pg(store, rank, world_size)
        self._group_addr = store_addr
        self.last_configure = "built"

    def _store(self, store_addr: str) -> Store:
        """torchft's ``create_store_client`` (``host:port/prefix``), over the last quorum's connection
        when its store is at the same address and still answers."""
        addr, _, prefix = store_addr.partition("/")
        kept = self._store_client
        if kept is not None and kept[0] == addr:
            try:
                kept[1].set_timeout(self._timeout)
                kept[1].check([])  # a round trip: the server is still there
                return PrefixStore(prefix, kept[1])
            except Exception:  # noqa: BLE001 - a store restarted at that address: connect again
                pass
        host, _, port = addr.rpartition(":")
        client = TCPStore(host_name=host.strip("[]"), port=int(port), is_master=False, wait_for_workers=False,
                          timeout=self._timeout)
        self._store_client = (addr, client)
        return PrefixStore(prefix, client)

    def _agree(self, store: Store, old: object, rank: int, world_size: int) -> Optional[list]:
        """Write this member's offer, read every member's: the old ranks to leave out, or ``None``."""
        mine = None
        if isinstance(old, ProcessGroupLinkEscape) and self._group_addr is not None and not old._closed:
            with self._lock:
                usable = self._aborted is None and self._timed_out is None
            if usable and not old._comm._closed:
                mine = (self._group_addr, old._le_rank, old._le_size, sorted(old.lost_peers))
        store.set(f"{reuse.PREFIX}{rank}", reuse.offer(*(mine or (None, 0, 0, ()))))
        offers = []
        try:
            for r in range(world_size):
                offers.append(reuse.parse(store.get(f"{reuse.PREFIX}{r}")))
        except Exception as exc:  # noqa: BLE001 - the store's timeout, in the words of a group's start-up
            missing = list(range(len(offers), world_size))
            cause = RendezvousError(f"members {missing} wrote no offer: {exc}", missing=missing)
            raise LinkEscapeBackendError(f"linkescape configure failed on rank {rank}: RendezvousError: {cause} "
                                         f"(timeout after {seconds(self._timeout) * 1e3:.0f}ms)", cause,
                                         op="configure", rank=rank) from exc
        return reuse.excluded(offers) if mine is not None else None

    def abort(self, errored: bool = True) -> None:
        """End every call in flight with an error, close the links at once."""
        pg = self._pg
        if isinstance(pg, ProcessGroupLinkEscape):
            why = CommClosed(f"process group aborted (quorum {self._quorum_id})")
            with self._lock:
                self._aborted = why
            # the collectives in flight first: their callers return now, not when the links are torn down
            with pg._state_lock:
                works = list(pg._inflight.values())
            for w in works:
                w._fail(why)
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Close the group, saying goodbye to the peers (they see this rank leave at once)."""
        pg, self._pg = self._pg, None
        if isinstance(pg, ProcessGroupLinkEscape):
            pg.shutdown()

    def errored(self) -> Optional[Exception]:
        """The error that requires a new quorum: a ``wait()`` that timed out (it aborted the group),
        a rank the group lost (its process ended, or no path to it is left), or ``None``."""
        pg = self._pg
        if not isinstance(pg, ProcessGroupLinkEscape):
            return None
        timed_out = self._timed_out
        if timed_out is not None and timed_out[0] is pg:
            return timed_out[1]
        lost = pg.lost_peers
        if not lost:
            return None
        peer, cause = sorted(lost.items())[0]
        return LinkEscapeBackendError(f"linkescape process group aborted on rank {pg._le_rank}: lost rank(s) "
                                      f"{sorted(lost)}: {type(cause).__name__}: {cause}", cause, op="errored",
                                      rank=pg._le_rank, peer=peer, group=pg.group_name)

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of the next ``configure`` and of the live group's later calls."""
        super().set_timeout(timeout)
        pg = self._pg
        if isinstance(pg, ProcessGroupLinkEscape):
            pg.set_timeout(timeout)

    @property
    def communicator(self):
        """The current quorum's :class:`~linkescape.Communicator` (faults, counters), or ``None``."""
        pg = self._pg
        return pg.communicator if isinstance(pg, ProcessGroupLinkEscape) else None

    def __repr__(self) -> str:
        return f"ProcessGroupLinkescape(pg={self._pg!r})"


# Gloo's words for a peer whose process closed its end or ended, and for a
# timeout: torchft and its tests recognise the errors that ask for a new quorum
# by them.
_CLOSED = ("closed its communicator", "closed every link")


def _torchft_error(exc: BaseException) -> BaseException:
    """``exc`` with Gloo's words added where a peer closed or ended, or a call timed out (the type stays)."""
    cause = getattr(exc, "cause", None)
    if not isinstance(exc, LinkEscapeBackendError):
        return exc
    if isinstance(cause, PeerLost) and any(w in str(cause) for w in _CLOSED):
        words = "Connection closed by peer"
    elif isinstance(cause, CommTimeout):
        words = "Timed out waiting for the peers"
    else:
        return exc
    return LinkEscapeBackendError(f"{exc} ({words})", cause, op=exc.op, rank=exc.rank,
                                  peer=exc.peer, global_peer=exc.global_peer, group=exc.group)


def _reraise(exc: BaseException):
    new = _torchft_error(exc)
    if new is exc:
        raise exc
    raise new from exc


class _Work(Work):
    """A linkescape work whose error torchft recognises (see :func:`_torchft_error`); ``wait()``
    without a timeout waits the group's timeout at most, as a Gloo work does (torchft's Manager waits
    so on its allreduce: a replica cut off from every peer then fails its step in time to rejoin).

    A ``wait()`` that times out while the operation still runs aborts the group first
    (``on_timeout``), then waits for the work to end (its finish step, a copy back into the caller's
    tensors, runs only if the operation had completed before the abort), then raises: once it
    raises, nothing writes into the tensors any more."""

    #: how long a timed-out wait waits for the aborted work to end (it ends within milliseconds)
    SETTLE_S = 5.0

    def __init__(self, work: Work, timeout_s: Optional[float], pg: object = None, on_timeout=None) -> None:
        super().__init__()
        self._work = work
        self._timeout_s = timeout_s
        self._pg = pg
        self._on_timeout = on_timeout

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            return self._work.wait(self._timeout_s if timeout is None else timeout)
        except Exception as exc:  # noqa: BLE001 - re-raised, in torchft's words
            if self._on_timeout is not None and isinstance(exc, LinkEscapeBackendError) \
                    and isinstance(exc.cause, CommTimeout) and not self._work.is_completed():
                exc = self._abort(exc)
            _reraise(exc)

    def _abort(self, exc: LinkEscapeBackendError) -> LinkEscapeBackendError:
        cause = CommTimeout(f"{exc.op} not complete after the wait's timeout: the group was aborted, the "
                            f"operation ended without writing into the tensors after this error",
                            op_seq=getattr(exc.cause, "op_seq", None))
        err = LinkEscapeBackendError(
            f"linkescape {exc.op} failed on rank {exc.rank}" + (f" in group {exc.group!r}" if exc.group else "")
            + f": CommTimeout: {cause}", cause, op=exc.op, rank=exc.rank, group=exc.group)
        self._on_timeout(self._pg, err)
        try:
            self._work.wait(timedelta(seconds=self.SETTLE_S))
        except Exception:  # noqa: BLE001 - it fails (aborted), as expected
            pass
        return err

    def get_future(self) -> "torch.futures.Future":
        def value(fut):
            try:
                return fut.value()
            except Exception as exc:  # noqa: BLE001 - re-raised, in torchft's words
                _reraise(exc)
        return self._work.get_future().then(value)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        exc = self._work.exception()
        return _torchft_error(exc) if exc is not None else None

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self):
        return self._work.result()

    def synchronize(self) -> None:
        self._work.synchronize()


__all__ = ["ProcessGroupLinkescape", "BACKEND_NAME"]
