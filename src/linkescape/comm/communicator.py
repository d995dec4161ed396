"""The public communicator: rendezvous, validation, dispatch to algorithms, Work."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import zlib
from typing import Dict, Optional, Sequence

import numpy as np

from ..common import ops as _ops
from ..algorithms import exchange, halving, latency, ring
from ..common.auth import load_key
from ..algorithms.base import Schedule, check_message_size, byte_view
from ..common.config import Config
from ..engine.beacon import RecordKey
from ..engine.core import Engine
from ..engine.driver import Driver
from ..engine.recovery import Recovery
from ..engine.link import Link
from ..engine.membership import shrink_locked
from ..engine.messages import ANY_SOURCE, EPOCH_SHIFT, InMessage, Op, OutMessage
from ..common.events import EventLog
from ..observe.flight import FlightRecorder, watch_signal
from ..common.log import setup_logging
from ..common.errors import CommClosed, CommTimeout, GroupShrunk, InvalidBuffer, InvalidRank, PeerLost, UsageError
from ..common.ops import ReduceOp
from ..protocol.frames import P2P_FLAG
from ..protocol.relaymac import RankKeys
from .rendezvous import LinkSetup, exchange as store_exchange, resolve_rails, start_up_peers
from ..transport.tcp import ensure_fd_budget

log = logging.getLogger("linkescape")

MAX_TAG = (1 << 62) - 1


class Work:
    """Handle of an asynchronous operation."""

    def __init__(self, comm: "Communicator", op: Op) -> None:
        self._comm = comm
        self._op = op

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until done; raises the operation's error, or CommTimeout when
        ``timeout`` passes first (the operation keeps running)."""
        # (done is set before the completion callbacks run, on the progress thread when the
        # operation completed there; finished once they all have: the caller's buffers are final.
        # They run under the engine lock, which the driver's wait takes: done after it means they
        # ran, unless this very thread runs them now, a callback waiting on its own operation.)
        if not self._op.finished:
            self._comm._driver.wait(self._op, timeout)
        if not self._op.done:
            exc = CommTimeout(f"{self._op.name} not complete after {timeout}s", op_seq=self._op.seq)
            self._comm._trace_timeout(exc)
            try:
                raise exc
            finally:
                del exc  # (kept here, it would hold this frame through its traceback: a cycle)
        if self._op.error is not None:
            self._comm._before_raise(self._op.error)
            raise self._op.error
        return True

    def is_completed(self) -> bool:
        return self._op.finished

    def done_within(self, timeout: float) -> bool:
        """Drive progress for up to ``timeout`` seconds; whether the operation
        ended (with or without error). Raises nothing: for waits in slices."""
        if not self._op.finished:
            self._comm._driver.wait(self._op, timeout)
        return self._op.done

    @property
    def source(self) -> Optional[int]:
        """The rank an any-source ``recv`` received from (None before it matched)."""
        return self._comm._group_rank(self._op.source)

    def exception(self) -> Optional[BaseException]:
        return self._op.error if self._op.done else None

    def add_done_callback(self, fn) -> None:
        """``fn(work)`` runs when the operation ends (possibly at once, possibly
        on the progress thread)."""
        with self._comm._driver.locked():  # a driving thread yields to us between two rounds
            run_now = self._op.done
            if not run_now:
                self._op.callbacks.append(lambda _op: fn(self))
        if run_now:
            fn(self)


@functools.lru_cache(maxsize=256)  # (4,096 kept ~1 MB of keys, filling for an hour under random shapes)
def _signature_of(fields: tuple) -> int:
    return zlib.crc32("|".join(str(f) for f in fields).encode()) & 0x7FFFFFFF


def _signature(*fields) -> int:
    # a job repeats the same few operations: computed once per shape
    try:
        return _signature_of(fields)
    except TypeError:  # an unhashable field
        return zlib.crc32("|".join(str(f) for f in fields).encode()) & 0x7FFFFFFF


class Communicator:
    """A group of ``world_size`` ranks connected by one link per rail per peer.

    ``store``: a torch.distributed Store or any object with ``set``/``get``.
    ``rails``: interface names or IPv4 addresses (default ``LINKESCAPE_RAILS``,
    else the interface that reaches the store's host).
    """

    def __init__(self, store, rank: int, world_size: int, rails: Optional[Sequence[str]] = None,
                 config: Optional[Config] = None) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"world_size must be a positive int, not {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidRank(rank, world_size)
        self.config = config or Config.from_env()
        setup_logging(rank)
        self.rank = rank
        self.world_size = world_size
        self._closed = False
        self._post_lock = threading.Lock()
        self._call = threading.local()  # per-thread timeout of the calls in call_timeout()
        self._seq = 0
        self._p2p_seq = 0
        #: a group made by ``shrink``: its rank -> the engine's (the first group's) rank; None: the same
        self._ranks: Optional[tuple] = None
        self._index: Optional[dict] = None
        #: how many shrinks made this group: its collectives are numbered from ``epoch << EPOCH_SHIFT``
        self._epoch = 0
        #: this group closes the engine when it closes (a group a shrink replaced does not)
        self._owner = True
        self._closed_error: Optional[BaseException] = None
        rails = list(rails) if rails else (list(self.config.rails) if self.config.rails else None)
        self.rail_addrs, self.rail_ifnames = resolve_rails(rails, store)
        self.rails = [n or a for n, a in zip(self.rail_ifnames, self.rail_addrs)]
        self.events = EventLog(rank, self.config.events)
        c = self.config
        # the thresholds choose the schedule: every operation's signature carries them (see _run)
        self._sig_tail = (c.small_bytes, c.direct_bytes, c.tree_ranks, c.tree_radix, c.halving_ranks, c.halving_bytes)
        self._setup = None
        self._recovery = None
        self._barrier = None  # (store, deadline) of the start-up barrier (neighbours mode)
        #: start-up ended at a barrier every rank passed (``connect_at_start=neighbours``): when
        #: this rank's init returned, every rank's start-up was done
        self.started_together = False
        if world_size > 1:
            self._connect(store)
        else:
            self._engine = Engine(rank, world_size, len(self.rail_addrs), self.config, self.events)
            self._driver = Driver(self._engine)
        self._driver.spin, self._driver.yield_for = self._spin_budget()
        starts = [self._build_peers, self._engine.start] + ([self._recovery.start] if self._recovery is not None
                                                             else [])
        self._start_barrier(lambda gated: self._driver.start_background(also=starts, gated=gated))
        self._attach_observers()
        log.info("rank %d/%d up on rails %s; a waiting caller busy-polls %.0f us, then yields the core %.0f us, "
                 "then blocks", rank, world_size, self.rails, self._driver.spin * 1e6, self._driver.yield_for * 1e6)

    def _build_peers(self) -> None:
        """(progress thread, first) The peers start-up did not build (``Engine(peers_now=)``)."""
        with self._driver.locked() as eng:
            eng.build_peers()

    def _start_barrier(self, start_threads) -> None:
        """Start the rank's threads (``start_threads(gated)``); with ``connect_at_start=neighbours``,
        inside a barrier: wait until every rank's start-up is done, then let recovery dial the links
        start-up left (the other peers', the backups). A rank done first used to dial at once: on a
        host with more ranks than cores its handshakes took the CPU from the ranks still starting (the
        slowest rank's init at 32 ranks on 2 cores: 148-183 ms, against 95-157 ms this way; see
        docs/benchmarks.md). The progress thread starts once this rank has arrived: a thread's start
        waits until the new thread runs, which on a loaded host is a scheduling round (17 ms at 32
        ranks on 2 cores), spent while the others arrive; it starts the beacon and recovery and
        drives progress only once the barrier is passed, for the same reason."""
        barrier, self._barrier = self._barrier, None
        if barrier is None:
            start_threads(False)
            return
        store, deadline = barrier
        try:
            self._setup.barrier(store, deadline, meanwhile=lambda: start_threads(True))
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self._recovery.release()
        self._driver.open_gate()
        self.started_together = True

    def _attach_observers(self) -> None:
        """The flight recorder (LINKESCAPE_TRACE_BUFFER) and the metrics server (LINKESCAPE_METRICS_PORT)."""
        self._flight = self._flight_post = None
        if self.config.trace_buffer:
            job = getattr(self, "job", b"") or b""
            self._flight = FlightRecorder(self.config.trace_buffer, self.rank, self.world_size, self.config.trace_dir,
                                          snapshot=self.snapshot, events=self.events,
                                          job=job.decode("ascii", "replace").rstrip("\0"), rails=self.rails)
            self._flight_post = self._flight.post_lock(self._post_lock)
            watch_signal(self._flight)
        self._metrics = None
        if self.config.metrics_port is not None:  # prometheus_client is imported only then
            from ..common.extras import require

            require(["prometheus_client"], "metrics", "LINKESCAPE_METRICS_PORT")
            from ..observe.metrics_server import attach

            self._metrics = attach(self, self._flight)

    def _connect(self, store) -> None:
        deadline = time.monotonic() + min(self.config.connect_timeout, self.config.timeout)
        ensure_fd_budget((self.world_size - 1) * len(self.rail_addrs))
        setup = LinkSetup(self.rank, self.world_size, self.rail_addrs, self.config)
        self._setup = setup
        relay_keys = RankKeys(self.rank)  # our X25519 key for relayed frames' end-to-end MACs (relaymac.py)
        publics: Dict[int, bytes] = {}
        try:
            job, peers, secret = store_exchange(store, self.rank, self.world_size, setup.addresses, deadline,
                                                with_secret=load_key(self.config) is None,
                                                public=relay_keys.public, publics=publics)
            # Active-backup: start-up opens the primary rail; the backups are
            # opened by recovery right after, off the caller's path (stripe: all).
            now_rails = None if self.config.policy == "stripe" or self.config.eager_backups else [0]
            # From NEIGHBOURS_FROM ranks on, only the ring neighbours' links (O(1) handshakes per
            # rank), then a store barrier; the rest are opened right after, as the backups are.
            now_peers = start_up_peers(self.rank, self.world_size, self.config, store)
            try:
                socks = setup.connect_all(job, peers, deadline, store=store, rails=now_rails, peers_now=now_peers,
                                          secret=secret)
            except Exception as exc:
                if now_peers is not None:
                    setup.report_start_failure(store, exc)  # the others wait at the barrier: they stop too
                raise
        except BaseException:
            setup.close()
            raise
        # (the start-up barrier comes once the engine and its threads run: see __init__)
        self._barrier = (store, deadline) if now_peers is not None else None
        self.job = job
        self.peer_addresses = peers
        # liveness and root causes through the store (the management network),
        # in records authenticated with the job's key
        # (neighbours: only the peers start-up connected are built now; the progress thread
        # builds the rest once it runs, off the caller's path: see ``starts`` in __init__)
        relay_keys.bind(setup.auth.key, job)
        for peer, public in publics.items():
            relay_keys.learn(peer, public)
        eng = self._engine = Engine(self.rank, self.world_size, len(self.rail_addrs), self.config, self.events,
                                    store=store, record_key=RecordKey(setup.auth.key, job), peers_now=now_peers,
                                    keys=relay_keys)
        self._driver = Driver(eng)
        now = eng.clock.now()
        with self._driver.locked():
            keys = setup.link_keys if self.config.frame_auth else {}
            eng.start_links([Link(sock, peer, rail, 1, now, mac_key=keys.get((peer, rail)))
                             for (peer, rail), sock in sorted(socks.items())])
        # Recovery waits on the acceptor (not the bare listeners): incoming
        # connections are authenticated without blocking its thread.
        self._recovery = Recovery(eng, setup.auth, setup.acceptor, self.rail_addrs, self.rail_ifnames, peers,
                                  self.config)
        if self._barrier is not None:
            self._recovery.hold_dials()

    def _spin_budget(self) -> tuple:
        """(seconds to busy-poll, seconds to poll yielding the core in between) before a waiting
        caller blocks. Busy-poll only when every rank on this host can have a core: spinning next
        to a peer that needs the core would only slow it down. Where two ranks share a core (the
        local ranks outnumber the cores at most two to one), poll with ``sched_yield`` between
        polls: the core goes to the rank the caller waits for without a sleep and a wake-up, which
        cost more than the call (docs/benchmarks.md: 4 ranks on 2 cores, 4 B all_reduce ~475 ->
        ~360 us). With more ranks a core, a yield mostly hands it to another rank that only polls."""
        addrs = getattr(self, "peer_addresses", {})
        mine = self.rail_addrs[0]
        local = 1 + sum(1 for a in addrs.values() if a and a[0][0] == mine)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        cfg = self.config
        spin = cfg.spin_us / 1e6 if cfg.spin_us is not None else (50e-6 if local <= cores else 0.0)
        shared = cores < local <= 2 * cores and hasattr(os, "sched_yield")
        yield_for = cfg.yield_us / 1e6 if cfg.yield_us is not None else (200e-6 if shared else 0.0)
        return spin, yield_for

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def call_timeout(self, seconds: Optional[float]):
        """Operations this thread posts inside the block time out after
        ``seconds`` (``CommTimeout``) instead of ``config.timeout``; None
        keeps the configured one. What torch's per-call ``timeout`` uses."""
        if seconds is not None and not seconds > 0:
            raise UsageError(f"timeout must be a positive number of seconds, got {seconds!r}")
        before = getattr(self._call, "timeout", None)
        self._call.timeout = seconds if seconds is not None else before
        try:
            yield
        finally:
            self._call.timeout = before

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error or CommClosed("communicator is closed")

    def _group_rank(self, rank: Optional[int]) -> Optional[int]:
        """The rank of this group of an engine rank (a shrunk group's ranks are renumbered)."""
        if self._index is None or rank is None or rank < 0:
            return rank
        return self._index.get(rank, rank)

    def _array(self, buf, name: str, writable: bool = True) -> np.ndarray:
        if not isinstance(buf, np.ndarray):
            raise InvalidBuffer(f"{name} must be a numpy.ndarray, not {type(buf).__name__}")
        if not buf.flags.c_contiguous:
            raise InvalidBuffer(f"{name} must be C-contiguous")
        if writable and not buf.flags.writeable:
            raise InvalidBuffer(f"{name} is read-only")
        if not _ops.supported_dtype(buf.dtype):
            raise _ops.UnsupportedDtype(f"{name} has unsupported dtype {buf.dtype}")
        return buf

    def _stacked(self, op: str, name: str, big: np.ndarray, part: np.ndarray) -> None:
        """``big`` must hold one ``part`` per rank: shape (world_size, *part.shape), same dtype."""
        want = (self.world_size, *part.shape)
        if big.shape != want or big.dtype != part.dtype:
            raise InvalidBuffer(f"{op}: {name} must have shape {want} and dtype {part.dtype}, "
                                f"not {big.shape} {big.dtype}")

    def _root(self, root: int, what: str = "root") -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.world_size:
            raise InvalidRank(root, self.world_size, what)
        return int(root)

    def _run(self, name: str, sig_fields, build, async_op: bool, finish=None, p2p: bool = False,
             timeout: Optional[float] = None, rooted: bool = False):
        self._check_open()
        posted_at = time.time()
        # Ops are posted in program order under the post lock; a synchronous
        # op is then driven outside it, so another thread may post meanwhile.
        self._post_lock.acquire()
        held = True
        try:
            # a shrink may have closed this group while we waited for the lock: never post on it
            self._check_open()
            if p2p:
                self._p2p_seq += 1
                seq = self._p2p_seq
                msg = 0
            else:
                self._seq += 1
                seq = msg = (self._epoch << EPOCH_SHIFT) + self._seq
            if timeout is None:
                timeout = getattr(self._call, "timeout", None) or self.config.timeout
            deadline = self._engine.clock.now() + timeout  # (the engine judges it by its clock)
            op = Op(seq, name, deadline, collective=not p2p, need_ack=rooted)
            # The thresholds choose the schedule: ranks configured differently
            # must get a mismatch error, not wait for messages never sent.
            sched = Schedule(op, self.rank, self.world_size, msg, _signature(name, *sig_fields, *self._sig_tail))
            build(sched)
            if self._ranks is not None:  # a shrunk group: its ranks are the engine's survivors
                ranks = self._ranks
                for m in op.sends:
                    m.peer = ranks[m.peer]
                for m in op.recvs:
                    if m.peer != ANY_SOURCE:
                        m.peer = ranks[m.peer]
            if finish is not None:
                op.callbacks.insert(0, lambda o: finish() if o.error is None else None)
            flight = self._flight
            slot = flight.record(op, sig_fields, posted_at) if flight is not None else None
            try:
                if async_op:
                    self._driver.start(op)
                    if slot is not None:
                        flight.started(slot)
                    return Work(self, op)
                held = False  # run() releases it once the op is posted
                if slot is not None:
                    self._flight_post.slot = slot  # marks the op started as it releases the post lock
                    self._driver.run(op, self._flight_post)
                else:
                    self._driver.run(op, self._post_lock)
            except BaseException as exc:
                if slot is not None:
                    flight.abandon(slot, exc)
                raise
        finally:
            if held:
                self._post_lock.release()
        if op.error is not None:
            self._before_raise(op.error)
            raise op.error
        return None

    def _reducer(self, op: ReduceOp, dtype: np.dtype, elems: int):
        return _ops.reducer(op, dtype, min(elems, max(self.config.chunk_bytes // max(dtype.itemsize, 1), 1)))

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        buf = self._array(buf, "buf")
        _ops.check_op(op, buf.dtype)
        flat = buf.reshape(-1)
        n = self.world_size
        small = buf.nbytes <= self.config.small_bytes
        if small:
            red = _ops.reducer(op, buf.dtype, flat.shape[0])
        else:
            red = self._reducer(op, buf.dtype, flat.shape[0])

        # One round to everyone beats log2(n) rounds only while the extra
        # messages are cheap: measured here, recursive doubling wins from 4
        # ranks on (4 ranks on 2 cores: 0.55-0.59x gloo against 0.63x).
        direct = n <= 3 and buf.nbytes * (n - 1) <= self.config.direct_bytes
        tree = small and n >= self.config.tree_ranks
        # from a few ranks on, mid-size messages take 2 log2(n) steps, not 2(n-1)
        halve = not small and n >= self.config.halving_ranks and buf.nbytes <= self.config.halving_bytes
        # float16 and bfloat16 round at every step, so the order of the sums
        # shows in the result: combine them in the order Gloo's ring does.
        gloo_order = _ops.is_half(buf.dtype) and op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.AVG)

        def build(s):
            if n == 1:
                return
            if direct:  # (it reduces the whole buffer at once, as halving does)
                latency.all_reduce_direct(s, flat, _ops.reducer(op, buf.dtype, flat.shape[0]), gloo_order)
            elif gloo_order:
                ring.all_reduce_gloo_order(s, flat, red)
            elif tree:
                latency.all_reduce_tree(s, flat, red, self.config.tree_radix)
            elif halve:  # (it reduces whole regions, not frames: a reducer for all of it)
                halving.all_reduce(s, flat, _ops.reducer(op, buf.dtype, flat.shape[0]))
            else:
                (latency.all_reduce if small else ring.all_reduce)(s, flat, red)

        finish = (lambda: _ops.finish_avg(flat, n)) if op is ReduceOp.AVG else None
        return self._run("all_reduce", (_ops.signature_dtype(buf.dtype), buf.size, op.value), build, async_op, finish)

    def broadcast(self, buf: np.ndarray, root: int = 0, async_op: bool = False):
        buf = self._array(buf, "buf")
        root = self._root(root)
        raw = byte_view(buf)
        small = buf.nbytes <= self.config.small_bytes

        def build(s):
            if self.world_size == 1:
                return
            if small:
                latency.broadcast(s, raw, root)
            else:
                ring.chain_broadcast(s, raw, root)

        return self._run("broadcast", (_ops.signature_dtype(buf.dtype), buf.size, root), build, async_op,
                         rooted=True)

    def reduce(self, buf: np.ndarray, root: int = 0, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        """Result lands in ``buf`` on ``root``; other ranks' buffers are unchanged."""
        buf = self._array(buf, "buf")
        root = self._root(root)
        _ops.check_op(op, buf.dtype)
        flat = buf.reshape(-1)
        n = self.world_size
        small = buf.nbytes <= self.config.small_bytes
        work = flat if self.rank == root else flat.copy()

        def build(s):
            if n == 1:
                return
            if small:
                latency.reduce(s, flat, root, _ops.reducer(op, buf.dtype, flat.shape[0]), work)
            else:
                ring.reduce_to_root(s, work, self._reducer(op, buf.dtype, flat.shape[0]), root)

        finish = (lambda: _ops.finish_avg(flat, n)) if op is ReduceOp.AVG and self.rank == root else None
        return self._run("reduce", (_ops.signature_dtype(buf.dtype), buf.size, op.value, root), build,
                         async_op, finish, rooted=True)

    def all_gather(self, out: np.ndarray, inp: np.ndarray, async_op: bool = False):
        out = self._array(out, "out")
        inp = self._array(inp, "inp", writable=False)
        n = self.world_size
        self._stacked("all_gather", "out", out, inp)
        out[self.rank] = inp
        oraw = byte_view(out)
        small = out.nbytes <= self.config.small_bytes

        def build(s):
            if n == 1:
                return
            if small:
                exchange.all_gather_direct(s, oraw)
            else:
                ring.all_gather(s, out.reshape(-1))

        return self._run("all_gather", (_ops.signature_dtype(inp.dtype), inp.size), build, async_op)

    def reduce_scatter(self, out: np.ndarray, inp: np.ndarray, op: ReduceOp = ReduceOp.SUM,
                       async_op: bool = False):
        out = self._array(out, "out")
        inp = self._array(inp, "inp", writable=False)
        n = self.world_size
        self._stacked("reduce_scatter", "inp", inp, out)
        _ops.check_op(op, inp.dtype)
        work = inp.reshape(-1).copy()
        small = inp.nbytes <= self.config.small_bytes
        size = out.size
        r = self.rank

        def build(s):
            if n == 1:
                return
            if small:
                latency.all_reduce(s, work, _ops.reducer(op, inp.dtype, work.shape[0]))
            else:
                ring.reduce_scatter_inplace(s, work, self._reducer(op, inp.dtype, work.shape[0]))

        def finish():
            res = out.reshape(-1)
            res[...] = work[r * size:(r + 1) * size]
            if op is ReduceOp.AVG:
                _ops.finish_avg(res, n)

        if n == 1:
            finish()
            return self._run("reduce_scatter", (), build, async_op)
        return self._run("reduce_scatter", (_ops.signature_dtype(inp.dtype), out.size, op.value), build,
                         async_op, finish)

    def all_to_all(self, out: np.ndarray, inp: np.ndarray, async_op: bool = False):
        out = self._array(out, "out")
        inp = self._array(inp, "inp", writable=False)
        if not inp.shape:
            raise InvalidBuffer(f"all_to_all: inp must have shape ({self.world_size}, ...), not {inp.shape}")
        self._stacked("all_to_all", "inp", inp, inp[0])
        self._stacked("all_to_all", "out", out, inp[0])
        if np.shares_memory(out, inp):
            raise InvalidBuffer("all_to_all: out and inp must not overlap")
        oraw, iraw = byte_view(out), byte_view(inp)
        return self._run("all_to_all", (_ops.signature_dtype(inp.dtype), inp.size),
                         lambda s: exchange.all_to_all(s, oraw, iraw), async_op)

    def gather(self, out: Optional[np.ndarray], inp: np.ndarray, root: int = 0, async_op: bool = False):
        inp = self._array(inp, "inp", writable=False)
        root = self._root(root)
        oraw = None
        if self.rank == root:
            out = self._array(out, "out")
            self._stacked("gather", "out", out, inp)
            oraw = byte_view(out)
        iraw = byte_view(inp)
        return self._run("gather", (_ops.signature_dtype(inp.dtype), inp.size, root),
                         lambda s: exchange.gather(s, oraw, iraw, root), async_op, rooted=True)

    def scatter(self, out: np.ndarray, inp: Optional[np.ndarray], root: int = 0, async_op: bool = False):
        out = self._array(out, "out")
        root = self._root(root)
        iraw = None
        if self.rank == root:
            inp = self._array(inp, "inp", writable=False)
            self._stacked("scatter", "inp", inp, out)
            iraw = byte_view(inp)
        oraw = byte_view(out)
        return self._run("scatter", (_ops.signature_dtype(out.dtype), out.size, root),
                         lambda s: exchange.scatter(s, oraw, iraw, root), async_op, rooted=True)

    def barrier(self, async_op: bool = False):
        token = np.zeros(1, np.uint8)

        red = _ops.reducer(ReduceOp.MAX, token.dtype, 1)
        # (from tree_ranks on the small all_reduce's tree: 2(n-1) messages, not n log2 n, with the
        # same partners as the calls around it, whose frames then carry the acknowledgements)
        tree = self.world_size >= self.config.tree_ranks

        def build(s):
            if self.world_size > 1:
                if tree:
                    latency.all_reduce_tree(s, token, red, self.config.tree_radix)
                else:
                    latency.all_reduce(s, token, red)

        return self._run("barrier", (), build, async_op)

    # ------------------------------------------------------------------ point to point
    def _p2p_peer(self, peer: int, what: str) -> int:
        peer = self._root(peer, what)
        if peer == self.rank:
            raise InvalidRank(peer, self.world_size, f"{what} (own rank)")
        return peer

    def _tag(self, tag: int) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) <= MAX_TAG:
            raise UsageError(f"tag must be an int in [0, {MAX_TAG}], not {tag!r}")
        return P2P_FLAG | int(tag)

    def send(self, buf: np.ndarray, dst: int, tag: int = 0, async_op: bool = False):
        buf = self._array(buf, "buf", writable=False)
        dst = self._p2p_peer(dst, "dst")
        check_message_size(buf.nbytes)
        msg = self._tag(tag)
        raw = byte_view(buf)

        def build(s):
            m = OutMessage(s.op, dst, msg, self._epoch & 0xFFFFFFFF, raw)
            s.op.sends.append(m)
            s.op.protect(raw)

        return self._run("send", (_ops.signature_dtype(buf.dtype), buf.size, dst, tag), build, async_op, p2p=True)

    def recv(self, buf: np.ndarray, src: Optional[int], tag: int = 0, async_op: bool = False):
        """Receive into ``buf`` from ``src``; ``src=None`` takes the first
        matching send (same tag) from any rank. Returns the source rank
        (synchronous), or a Work whose ``source`` is set once it completed."""
        buf = self._array(buf, "buf")
        src = ANY_SOURCE if src is None else self._p2p_peer(src, "src")
        check_message_size(buf.nbytes)
        msg = self._tag(tag)
        raw = byte_view(buf)
        op_box = []

        def build(s):
            s.op.recvs.append(InMessage(s.op, src, msg, self._epoch & 0xFFFFFFFF, len(raw), dst=raw))
            s.op.pending_recvs += 1
            op_box.append(s.op)

        work = self._run("recv", (_ops.signature_dtype(buf.dtype), buf.size, src, tag), build, async_op, p2p=True)
        if async_op:
            return work
        return src if src != ANY_SOURCE else self._group_rank(op_box[0].source)

    # ------------------------------------------------------------------ faults and counters
    def inject_fault(self, rail: int, kind: str) -> float:
        """Emulate a fault on this rank's ``rail`` inside the process: ``cut``
        (carrier loss: links down, peers told), ``blackhole`` (silent loss) or
        ``restore``. For tests and demos without root; real faults come from
        the kernel. Returns the wall time at which it took effect."""
        self._check_open()
        if self._recovery is None:
            raise UsageError("a communicator of one rank has no links to fault")
        ts = self._driver.call(lambda: self._recovery.inject(rail, kind))
        self._engine.wake()
        return ts

    def rail_bytes(self) -> list:
        """Bytes sent and received per rail, over every link ever opened on it."""
        totals = self._driver.call(self._engine.rail_totals)
        return [{"rail": r, "sent": s, "received": rcv} for r, (s, rcv) in enumerate(totals)]

    def snapshot(self) -> dict:
        """This rank's links and channels as plain data: per peer the primary
        and active rails, the channel counters (``sent``: frames numbered,
        ``acked``: acknowledged by the peer, ``received``: applied from it),
        and per rail the link state and bytes moved. Consistent (taken under
        the engine lock); cheap enough to call every second."""
        snap = self._driver.call(self._engine.snapshot)
        snap["rail_names"] = list(self.rails)
        # wake-ups of each of this rank's threads, and its store calls (idle cost)
        beacon = self._engine.beacon
        snap["wakeups"] = {"engine": snap["wakeups"],
                           "recovery": self._recovery.wakeups if self._recovery is not None else 0,
                           "beacon": beacon.wakeups if beacon is not None else 0}
        snap["store_calls"] = beacon.calls if beacon is not None else 0
        # a record the job did not write was read: the store is no evidence about any peer any more
        snap["store_untrusted"] = beacon.tampered if beacon is not None else None
        # connections closed for failing the handshake or the key proof
        snap["rejected_connections"] = self._setup.rejected if self._setup is not None else 0
        return snap

    # ------------------------------------------------------------------ flight recorder
    @property
    def flight_recorder(self):
        """The ring of the last operations (None with LINKESCAPE_TRACE_BUFFER=0)."""
        return self._flight

    def dump_trace(self, directory: Optional[str] = None, reason: str = "manual") -> Optional[str]:
        """Write the flight recorder's dump to ``directory`` (default
        LINKESCAPE_TRACE_DIR) now; returns the file's path."""
        if self._flight is None:
            raise UsageError("the flight recorder is off (LINKESCAPE_TRACE_BUFFER=0)")
        if not (directory or self._flight.trace_dir):
            raise UsageError("no directory: pass one or set LINKESCAPE_TRACE_DIR")
        return self._flight.dump(reason, directory=directory, force=True)

    def _before_raise(self, exc: BaseException) -> None:
        """A rank that found a peer lost records it in the store before the
        caller sees the error (and perhaps exits), so the others name the
        same peer."""
        beacon = self._engine.beacon
        if beacon is not None and isinstance(exc, PeerLost):
            beacon.wait_reported(1.0)

    def _trace_timeout(self, exc: BaseException) -> None:
        if self._flight is not None:
            self._flight._trigger("timeout", exc)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Deliver what is still unacknowledged, say goodbye to every peer, close."""
        self._shutdown(graceful=True)

    def abort(self) -> None:
        """Close at once: pending operations fail, nothing more is delivered."""
        self._shutdown(graceful=False)

    # ------------------------------------------------------------------ shrink
    def shrink(self, exclude: Sequence[int], abort: bool = True) -> "Communicator":
        """A new communicator of the ranks not in ``exclude``, over this one's
        links (no handshake, no store exchange). Only the survivors call it, each
        with the same ``exclude``; ranks are renumbered densely in their old
        order, as torch's ``shrink_group`` does. Operations in flight fail with
        ``GroupShrunk`` first (``abort=False``: refused with UsageError while any
        is). This communicator is closed by it (``GroupShrunk``); the new one
        keeps its rails, backups, relays (through survivors), auth, metrics and
        events, and emits the ``shrink`` event. Errors of the new group name
        ranks in the numbering of the first group (the engine's)."""
        self._check_open()
        started = time.monotonic()
        try:
            gone = sorted({int(r) for r in exclude})
        except (TypeError, ValueError):
            raise UsageError(f"exclude must be a sequence of ranks, not {exclude!r}") from None
        for r in gone:
            if not 0 <= r < self.world_size:
                raise InvalidRank(r, self.world_size, "exclude")
        if self.rank in gone:
            raise UsageError(f"rank {self.rank} is in exclude: only the ranks that stay call shrink")
        if len(gone) != len(list(exclude)):
            raise UsageError(f"exclude names a rank twice: {list(exclude)}")
        if not gone:
            raise UsageError("exclude is empty: name at least one rank to leave out")
        old = self._ranks or range(self.world_size)
        out = set(gone)
        keep = [r for r in range(self.world_size) if r not in out]
        ranks = tuple(old[r] for r in keep)
        epoch = self._epoch + 1
        with self._post_lock:  # nothing is posted on the old group meanwhile
            self._check_open()
            ended = self._driver.call(lambda: shrink_locked(self._engine, [old[r] for r in gone], epoch, abort))
            new = object.__new__(Communicator)
            new.__dict__.update(self.__dict__)
            new._call = threading.local()
            new._ranks = ranks
            new._index = {e: i for i, e in enumerate(ranks)}
            new.rank = new._index[old[self.rank]]
            new.world_size = len(ranks)
            new._epoch = epoch
            new._seq = 0
            c = self.config
            # ranks that shrank differently get a mismatch error, not each other's data
            new._sig_tail = (c.small_bytes, c.direct_bytes, c.tree_ranks, c.tree_radix, c.halving_ranks, c.halving_bytes, epoch,
                             zlib.crc32(repr(ranks).encode()))
            self._owner = False
            self._closed = True
            self._closed_error = GroupShrunk(f"the group was shrunk (ranks {gone} left out): use the communicator "
                                             f"shrink returned", excluded=gone)
        took = time.monotonic() - started
        self.events.emit("shrink", peer=None, rail=None, excluded=[old[r] for r in gone], old_size=self.world_size,
                         new_size=new.world_size, duration_s=round(took, 6), epoch=epoch, ops_ended=ended)
        log.info("rank %d: group shrunk from %d to %d ranks (left out %s) in %.1f ms; now rank %d", self.rank,
                 self.world_size, new.world_size, gone, took * 1e3, new.rank)
        return new

    def set_timeout(self, seconds: float) -> None:
        """The timeout of later operations; it also caps the no-path deadline (a call
        never waits longer than this for a rank without a path)."""
        if not isinstance(seconds, (int, float)) or not seconds > 0:
            raise UsageError(f"timeout must be a positive number of seconds, got {seconds!r}")
        self.config = self.config.replace(timeout=float(seconds))
        self._driver.call(lambda: self._engine.liveness.cap(float(seconds)))

    def _shutdown(self, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._owner:
            return
        if getattr(self, "_metrics", None) is not None:
            self._metrics.close()
        if self._recovery is not None:
            self._recovery.close(graceful)
        self._driver.close(graceful=graceful)  # the engine, its background thread and its beacon
        if self._setup is not None:
            self._setup.close()
        if getattr(self, "_flight", None) is not None:
            self._flight.close()
        self.events.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, rails={self.rails})"
