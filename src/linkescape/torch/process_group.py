"""``ProcessGroupLinkEscape``: a ``torch.distributed.ProcessGroup`` over a
linkescape :class:`~linkescape.Communicator`.

Every method posts library operations with ``async_op=True`` and returns a
:class:`~linkescape.torch.work.LinkEscapeWork` at once; the library's
progress engine completes it, so DDP's gradient buckets overlap backward.

Mapping onto the Communicator:

* ``all_to_all_single`` without split sizes uses ``Communicator.all_to_all``;
  with split sizes (even or not), and the list form ``all_to_all``, use
  send/recv pairs under a tag reserved for the backend, so blocks may have
  any size. Every rank must therefore pass split sizes, or none.
* list-of-tensor forms (``all_gather``, ``gather``, ``scatter``,
  ``reduce_scatter``) go through one contiguous host buffer of shape
  ``(world_size, ...)``, copied from / to the caller's tensors.
* ``all_reduce_coalesced`` flattens the tensors of each dtype into one buffer.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..config import Config
from ..errors import CommClosed, LinkEscapeError, LinkFailure, PeerLost, UsageError
from . import convert
from .convert import Staged, stage, reduce_op, to_numpy
from .work import LinkEscapeBackendError, LinkEscapeWork, coalesced, stop_completer, wrap_error

log = logging.getLogger("linkescape.torch")

BACKEND_NAME = "linkescape"
#: p2p tags at and above this are the backend's own (all_to_all exchanges);
#: torch tags are 32-bit ints, so they never reach it
A2A_TAG_BASE = 1 << 61
_A2A_TAG_SPAN = 1 << 40
_live: Dict[int, "ProcessGroupLinkEscape"] = {}
_live_lock = threading.Lock()


def get_communicator(group=None) -> Communicator:
    """The linkescape Communicator behind a process group (default: the
    world), e.g. for ``inject_fault`` or ``rail_bytes``."""
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupLinkEscape):
        return pg.communicator
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001 - not a group with a cpu backend
        backend = None
    if isinstance(backend, ProcessGroupLinkEscape):
        return backend.communicator
    with _live_lock:
        groups = [g for g in _live.values() if g is pg or g is backend]
    if groups:
        return groups[0].communicator
    raise RuntimeError(f"{pg!r} is not a linkescape process group")


def _writeback(staged: Sequence[Staged]) -> Optional[Callable[[], None]]:
    todo = [s for s in staged if not convert.direct(s.tensor)]
    if not todo:
        return None

    def run() -> None:
        for s in todo:
            s.write_back()
    return run


def _chain(*fns: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    fns = [f for f in fns if f is not None]
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def run() -> None:
        for f in fns:
            f()
    return run


def make_config(timeout_s: Optional[float], pg_options=None) -> Config:
    """The Communicator's config: ``pg_options`` when it is a Config, else the
    LINKESCAPE_* environment; torch's ``timeout`` replaces the operation and
    connect timeouts, unless it is torch's default and LINKESCAPE_TIMEOUT is
    set."""
    if isinstance(pg_options, Config):
        cfg = pg_options
    else:
        # Silent-loss detection reads the peer kernel's acknowledgements, so a
        # rank holding the GIL for long stretches does not trip it: the
        # library's defaults hold for torch jobs too.
        cfg = Config.from_env()
    if timeout_s is None:
        return cfg
    # torch passes its default (30 min) when the caller gave no timeout: then
    # an explicit LINKESCAPE_TIMEOUT / LINKESCAPE_CONNECT_TIMEOUT or Config wins
    explicit = abs(timeout_s - dist.constants.default_pg_timeout.total_seconds()) > 1e-6
    changes = {}
    if explicit or not (os.environ.get("LINKESCAPE_TIMEOUT") or isinstance(pg_options, Config)):
        changes["timeout"] = timeout_s
    if explicit or not (os.environ.get("LINKESCAPE_CONNECT_TIMEOUT") or isinstance(pg_options, Config)):
        changes["connect_timeout"] = timeout_s
    return cfg.replace(**changes) if changes else cfg


class _BackendInfo:
    """Answers for torch code that inspects ``pg._get_backend(device)``."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def name(self) -> str:
        return BACKEND_NAME

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def __repr__(self) -> str:
        return "<linkescape backend>"


class ProcessGroupLinkEscape(dist.ProcessGroup):
    """torch.distributed process group backed by a linkescape Communicator."""

    def __init__(self, store, rank: int, size: int, timeout=None, *, group_name: str = "",
                 global_ranks: Optional[Sequence[int]] = None, config: Optional[Config] = None,
                 rails: Optional[Sequence[str]] = None) -> None:
        super().__init__(rank, size)
        self._le_rank = int(rank)
        self._le_size = int(size)
        self._group_name = group_name or ""
        self._group_desc = ""
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._timeout_s = convert.seconds(timeout)
        self.config = config if config is not None else make_config(self._timeout_s)
        self._pid = os.getpid()
        self._coalescing: Optional[List[LinkEscapeWork]] = None
        self._a2a_seq = 0
        self._closed = False
        try:
            self._comm = Communicator(store, self._le_rank, self._le_size, rails=rails, config=self.config)
        except UsageError:
            raise
        except LinkEscapeError as exc:
            raise wrap_error(exc, "init", self._le_rank, self._group_name, self._global_ranks) from exc
        #: collective works in flight, and group members known to be gone
        self._inflight: Dict[int, LinkEscapeWork] = {}
        self._lost: Dict[int, BaseException] = {}
        self._state_lock = threading.Lock()
        try:
            self._comm.events.subscribe(self._on_event)
        except Exception:  # noqa: BLE001 - an EventLog without subscriptions
            log.debug("cannot subscribe to link events", exc_info=True)
        with _live_lock:
            _live[id(self)] = self
        _ensure_atexit()

    # ------------------------------------------------------------ identity
    @property
    def communicator(self) -> Communicator:
        return self._comm

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _get_backend(self, device=None) -> "_BackendInfo":
        """What torch asks a group's per-device backend (splitting, coalescing,
        tensor allocation): this group is its own backend for every device."""
        return _BackendInfo()

    def __repr__(self) -> str:
        return (f"ProcessGroupLinkEscape(rank={self._le_rank}, size={self._le_size}, group={self._group_name!r}, "
                f"rails={self._comm.rails})")

    # ------------------------------------------------------------ plumbing
    def _check(self) -> None:
        if self._pid != os.getpid():
            raise LinkEscapeBackendError(
                f"linkescape process group {self._group_name!r} was created in process {self._pid} before "
                f"fork(); it cannot be used in the child {os.getpid()} (create process groups after fork)",
                CommClosed("process group inherited through fork"), rank=self._le_rank, group=self._group_name)

    def _post(self, name: str, issue: Callable[[], list], outputs: List[torch.Tensor],
              finish: Optional[Callable[[], None]] = None, keep=None, source_rank: int = -1,
              collective: bool = True) -> LinkEscapeWork:
        self._check()
        if collective and self._lost:
            exc = next(iter(self._lost.values()))
            raise wrap_error(exc, name, self._le_rank, self._group_name, self._global_ranks) from exc
        try:
            parts = issue()
        except UsageError:
            raise
        except LinkEscapeError as exc:
            self._note_failure(exc)
            raise wrap_error(exc, name, self._le_rank, self._group_name, self._global_ranks) from exc
        work = LinkEscapeWork(name, parts, outputs, finish, rank=self._le_rank, group=self._group_name,
                              global_ranks=self._global_ranks, keep=keep, source_rank=source_rank)
        if collective and self._le_size > 1:
            self._track(work)
        else:
            work._listen(self._work_done)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    # ---- failure propagation
    # The library fails an operation when a peer it exchanges data with is
    # lost; a collective whose algorithm reaches the lost rank only through
    # others would wait for them (or the timeout). Every member's links see
    # a dead process at once, so the group fails every collective in flight,
    # and refuses later ones, naming the lost rank.
    def _track(self, work: LinkEscapeWork) -> None:
        key = id(work)
        with self._state_lock:
            self._inflight[key] = work
            lost = next(iter(self._lost.values()), None)
        work._listen(self._work_done)
        if lost is not None:
            work._fail(lost)

    def _work_done(self, work: LinkEscapeWork) -> None:
        with self._state_lock:
            self._inflight.pop(id(work), None)
        cause = work._cause
        if cause is not None:
            self._note_failure(cause)

    def _note_failure(self, exc: BaseException) -> None:
        if isinstance(exc, (PeerLost, LinkFailure)) and isinstance(getattr(exc, "peer", None), int):
            self._peer_gone(exc.peer, exc)

    def _on_event(self, record) -> None:
        # runs on the library's progress thread, under its locks: be quick
        if record.get("event") == "peer_lost" and isinstance(record.get("peer"), int):
            peer = record["peer"]
            self._peer_gone(peer, PeerLost(str(record.get("detail") or f"rank {peer} was lost"), peer=peer))

    def _peer_gone(self, peer: int, exc: BaseException) -> None:
        with self._state_lock:
            self._lost.setdefault(peer, exc)
            works = list(self._inflight.values())
        for w in works:
            w._fail(exc)

    @property
    def lost_peers(self) -> Dict[int, BaseException]:
        """Group ranks this group knows to be gone, with the error that said so."""
        with self._state_lock:
            return dict(self._lost)

    def _root(self, root: int) -> int:
        root = int(root)
        if not 0 <= root < self._le_size:
            raise UsageError(f"root {root} is not a rank of this group of {self._le_size}")
        return root

    def _exchange(self, send: List[np.ndarray], recv: List[np.ndarray], what: str) -> list:
        """Block i of ``send`` to rank i, block i of ``recv`` from rank i, by
        send/recv pairs (blocks of any size; empty ones are skipped)."""
        n, r, comm = self._le_size, self._le_rank, self._comm
        for i in range(n):
            peer_in = send[i].nbytes if i == r else None
            if peer_in is not None and recv[i].nbytes != peer_in:
                raise UsageError(f"{what}: rank {r} sends itself {send[i].shape} but expects {recv[i].shape}")
        self._a2a_seq += 1
        tag = A2A_TAG_BASE + self._a2a_seq % _A2A_TAG_SPAN
        parts = []
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            if recv[src].size:
                parts.append(comm.recv(recv[src], src, tag, async_op=True))
            if send[dst].size:
                parts.append(comm.send(send[dst], dst, tag, async_op=True))
        if recv[r].size:
            recv[r][...] = send[r]
        return parts

    # ------------------------------------------------------------ all_reduce
    def allreduce(self, tensors, opts=None) -> LinkEscapeWork:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            red = dist.ReduceOp.SUM
        elif isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
            red = opts
        else:
            red = opts.reduceOp
        op = reduce_op(red)
        staged = [stage(t) for t in tensors]
        comm = self._comm
        return self._post("all_reduce", lambda: [comm.all_reduce(s.array, op, async_op=True) for s in staged],
                          list(tensors), _writeback(staged), keep=staged)

    def allreduce_coalesced(self, tensors, opts=None) -> LinkEscapeWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        tensors = list(tensors)
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            convert.check_dtype(t)
            by_dtype.setdefault(t.dtype, []).append(t)
        flats = []
        for dtype, ts in by_dtype.items():
            flat = torch.cat([t.detach().reshape(-1).to("cpu") for t in ts]) if ts else torch.empty(0, dtype=dtype)
            flats.append((flat, ts))
        comm = self._comm

        def issue():
            return [comm.all_reduce(to_numpy(flat), op, async_op=True) for flat, _ in flats]

        def finish():
            with torch.no_grad():
                for flat, ts in flats:
                    off = 0
                    for t in ts:
                        k = t.numel()
                        t.copy_(flat[off:off + k].view(t.shape))
                        off += k
            convert.sync_devices(tensors)
        return self._post("all_reduce_coalesced", issue, tensors, finish, keep=flats)

    # ------------------------------------------------------------ rooted
    def broadcast(self, tensors, opts=None) -> LinkEscapeWork:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = self._root(opts.rootRank if opts is not None else 0)
        is_root = self._le_rank == root
        staged = [stage(t, load=is_root) for t in tensors]
        comm = self._comm
        return self._post("broadcast", lambda: [comm.broadcast(s.array, root, async_op=True) for s in staged],
                          list(tensors), None if is_root else _writeback(staged), keep=staged)

    def reduce(self, tensors, opts=None) -> LinkEscapeWork:
        root = self._root(opts.rootRank if opts is not None else 0)
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        staged = [stage(t) for t in tensors]
        comm = self._comm
        return self._post("reduce", lambda: [comm.reduce(s.array, root, op, async_op=True) for s in staged],
                          list(tensors), _writeback(staged) if self._le_rank == root else None, keep=staged)

    def gather(self, output_tensors, input_tensors, opts=None) -> LinkEscapeWork:
        root = self._root(opts.rootRank if opts is not None else 0)
        n = self._le_size
        if len(input_tensors) != 1:
            raise UsageError("gather takes exactly one input tensor")
        inp = input_tensors[0]
        si = stage(inp)
        host = arr = None
        finish = None
        outs: List[torch.Tensor] = []
        if self._le_rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != n:
                raise UsageError(f"gather: the root needs a list of {n} output tensors")
            outs = list(output_tensors[0])
            convert.check_same(outs, inp.shape, inp.dtype, "gather")
            host = torch.empty((n, *inp.shape), dtype=inp.dtype)
            arr = to_numpy(host)
            finish = convert.unstack_to(host, outs)
        comm = self._comm
        return self._post("gather", lambda: [comm.gather(arr, si.array, root, async_op=True)], outs, finish,
                          keep=(si, host))

    def scatter(self, output_tensors, input_tensors, opts=None) -> LinkEscapeWork:
        root = self._root(opts.rootRank if opts is not None else 0)
        n = self._le_size
        if len(output_tensors) != 1:
            raise UsageError("scatter takes exactly one output tensor")
        out = output_tensors[0]
        so = stage(out, load=False)
        host = arr = None
        if self._le_rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != n:
                raise UsageError(f"scatter: the root needs a list of {n} input tensors")
            convert.check_same(input_tensors[0], out.shape, out.dtype, "scatter")
            host, arr = convert.stack_inputs(input_tensors[0], "scatter")
        comm = self._comm
        return self._post("scatter", lambda: [comm.scatter(so.array, arr, root, async_op=True)], [out],
                          _writeback([so]), keep=(so, host))

    # ------------------------------------------------------------ all_gather
    def _all_gather_list(self, outs, inp, comm, what="all_gather"):
        n = self._le_size
        outs = list(outs)
        if len(outs) != n:
            raise UsageError(f"{what}: needs {n} output tensors, got {len(outs)}")
        convert.check_same(outs, inp.shape, inp.dtype, f"{what} (tensors of different sizes are not supported)")
        si = stage(inp)
        host = torch.empty((n, *inp.shape), dtype=inp.dtype)
        arr = to_numpy(host)
        return (lambda: comm.all_gather(arr, si.array, async_op=True)), convert.unstack_to(host, outs), (si, host)

    def allgather(self, output_tensors, input_tensors, opts=None) -> LinkEscapeWork:
        comm = self._comm
        plans = [self._all_gather_list(outs, inp, comm) for outs, inp in zip(output_tensors, input_tensors)]
        outputs = [t for outs in output_tensors for t in outs]
        return self._post("all_gather", lambda: [p[0]() for p in plans], outputs, _chain(*[p[1] for p in plans]),
                          keep=plans)

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> LinkEscapeWork:
        comm = self._comm
        plans = [self._all_gather_list(outs, inp, comm, "all_gather_coalesced")
                 for outs, inp in zip(output_lists, input_list)]
        outputs = [t for outs in output_lists for t in outs]
        return self._post("all_gather_coalesced", lambda: [p[0]() for p in plans], outputs,
                          _chain(*[p[1] for p in plans]), keep=plans)

    def _all_gather_flat(self, output, inp, comm):
        n = self._le_size
        if output.numel() != n * inp.numel() or output.dtype != inp.dtype:
            raise UsageError(f"all_gather_into_tensor: output must hold {n} x {inp.numel()} elements of {inp.dtype}, "
                             f"not {output.numel()} of {output.dtype}")
        si = stage(inp)
        so = stage(output, load=False)
        oarr = so.array.reshape((n, *si.array.shape))
        return (lambda: comm.all_gather(oarr, si.array, async_op=True)), _writeback([so]), (si, so)

    def all_gather_single(self, output, inp, opts=None) -> LinkEscapeWork:
        call, finish, keep = self._all_gather_flat(output, inp, self._comm)
        return self._post("all_gather_into_tensor", lambda: [call()], [output], finish, keep=keep)

    _allgather_base = all_gather_single
    allgather_into_tensor = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> LinkEscapeWork:
        comm = self._comm
        plans = [self._all_gather_flat(o, i, comm) for o, i in zip(outputs, inputs)]
        return self._post("all_gather_into_tensor_coalesced", lambda: [p[0]() for p in plans], list(outputs),
                          _chain(*[p[1] for p in plans]), keep=plans)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ------------------------------------------------------------ reduce_scatter
    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> LinkEscapeWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        n, comm = self._le_size, self._comm
        plans = []
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != n:
                raise UsageError(f"reduce_scatter: needs {n} input tensors, got {len(ins)}")
            convert.check_same(ins, out.shape, out.dtype, "reduce_scatter")
            host, arr = convert.stack_inputs(ins, "reduce_scatter")
            so = stage(out, load=False)
            plans.append((so, arr, host))
        return self._post("reduce_scatter",
                          lambda: [comm.reduce_scatter(so.array, arr, op, async_op=True) for so, arr, _ in plans],
                          list(output_tensors), _writeback([p[0] for p in plans]), keep=plans)

    def _reduce_scatter_flat(self, output, inp, op, comm):
        n = self._le_size
        if inp.numel() != n * output.numel() or output.dtype != inp.dtype:
            raise UsageError(f"reduce_scatter_tensor: input must hold {n} x {output.numel()} elements of "
                             f"{output.dtype}, not {inp.numel()} of {inp.dtype}")
        si = stage(inp)
        so = stage(output, load=False)
        iarr = si.array.reshape((n, *so.array.shape))
        return (lambda: comm.reduce_scatter(so.array, iarr, op, async_op=True)), _writeback([so]), (si, so)

    def reduce_scatter_single(self, output, inp, opts=None) -> LinkEscapeWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        call, finish, keep = self._reduce_scatter_flat(output, inp, op, self._comm)
        return self._post("reduce_scatter_tensor", lambda: [call()], [output], finish, keep=keep)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> LinkEscapeWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        comm = self._comm
        plans = [self._reduce_scatter_flat(o, i, op, comm) for o, i in zip(outputs, inputs)]
        return self._post("reduce_scatter_tensor_coalesced", lambda: [p[0]() for p in plans], list(outputs),
                          _chain(*[p[1] for p in plans]), keep=plans)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------ all_to_all
    def alltoall(self, output_tensors, input_tensors, opts=None) -> LinkEscapeWork:
        n = self._le_size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise UsageError(f"all_to_all: needs {n} input and {n} output tensors")
        for o, i in zip(output_tensors, input_tensors):
            if o.dtype != i.dtype:
                raise UsageError(f"all_to_all: dtype {i.dtype} sent into {o.dtype}")
        si = [stage(t) for t in input_tensors]
        so = [stage(t, load=False) for t in output_tensors]
        send = [s.array.reshape(-1) for s in si]
        if any(np.shares_memory(a, b.array) for a in send for b in so):
            send = [a.copy() for a in send]
        recv = [s.array.reshape(-1) for s in so]
        return self._post("all_to_all", lambda: self._exchange(send, recv, "all_to_all"), list(output_tensors),
                          _writeback(so), keep=(si, so, send))

    def all_to_all_single(self, output, inp, output_split_sizes, input_split_sizes, opts=None) -> LinkEscapeWork:
        n, comm = self._le_size, self._comm
        if output.dtype != inp.dtype:
            raise UsageError(f"all_to_all_single: dtype {inp.dtype} sent into {output.dtype}")
        out_splits = [int(s) for s in (output_split_sizes or [])]
        in_splits = [int(s) for s in (input_split_sizes or [])]
        si = stage(inp)
        so = stage(output, load=False)
        iarr, oarr = si.array, so.array
        if np.shares_memory(iarr, oarr):
            iarr = iarr.copy()
        if not out_splits and not in_splits:
            if inp.numel() != output.numel() or (inp.dim() and inp.shape[0] % n):
                raise UsageError(f"all_to_all_single: without split sizes, input and output must have the same "
                                 f"size and dim 0 divisible by {n}")
            i2 = iarr.reshape((n, -1))
            o2 = oarr.reshape((n, -1))
            return self._post("all_to_all_single", lambda: [comm.all_to_all(o2, i2, async_op=True)], [output],
                              _writeback([so]), keep=(si, so, iarr))
        if inp.dim() == 0 or output.dim() == 0:
            raise UsageError("all_to_all_single with split sizes needs tensors of at least one dimension")
        if not in_splits:
            if inp.shape[0] % n:
                raise UsageError(f"all_to_all_single: input dim 0 = {inp.shape[0]} not divisible by {n}")
            in_splits = [inp.shape[0] // n] * n
        if not out_splits:
            if output.shape[0] % n:
                raise UsageError(f"all_to_all_single: output dim 0 = {output.shape[0]} not divisible by {n}")
            out_splits = [output.shape[0] // n] * n
        if len(in_splits) != n or len(out_splits) != n:
            raise UsageError(f"all_to_all_single: split sizes need {n} entries")
        send = convert.rows(iarr, in_splits, "all_to_all_single input")
        recv = convert.rows(oarr, out_splits, "all_to_all_single output")
        return self._post("all_to_all_single", lambda: self._exchange(send, recv, "all_to_all_single"), [output],
                          _writeback([so]), keep=(si, so, iarr))

    alltoall_base = all_to_all_single

    # ------------------------------------------------------------ barrier, p2p
    def barrier(self, opts=None) -> LinkEscapeWork:
        comm = self._comm
        return self._post("barrier", lambda: [comm.barrier(async_op=True)], [])

    def send(self, tensors, dst: int, tag: int = 0) -> LinkEscapeWork:
        staged = [stage(t) for t in tensors]
        comm = self._comm
        return self._post("send", lambda: [comm.send(s.array, int(dst), int(tag), async_op=True) for s in staged],
                          list(tensors), keep=staged, collective=False)

    def recv(self, tensors, src: int, tag: int = 0) -> LinkEscapeWork:
        staged = [stage(t, load=False) for t in tensors]
        comm = self._comm
        return self._post("recv", lambda: [comm.recv(s.array, int(src), int(tag), async_op=True) for s in staged],
                          list(tensors), _writeback(staged), keep=staged, source_rank=int(src), collective=False)

    def recv_anysource(self, tensors, tag: int = 0) -> LinkEscapeWork:
        raise UsageError("the linkescape backend does not support recv from any source (src=None); "
                         "name the source rank")

    # ------------------------------------------------------------ coalescing
    def start_coalescing(self, device=None) -> None:
        if self._coalescing is not None:
            raise UsageError("start_coalescing called twice without end_coalescing")
        self._coalescing = []

    def end_coalescing(self, device=None) -> LinkEscapeWork:
        works, self._coalescing = self._coalescing or [], None
        return coalesced("coalesced", works, rank=self._le_rank, group=self._group_name,
                         global_ranks=self._global_ranks)

    def _start_coalescing(self, device=None) -> None:
        self.start_coalescing(device)

    def _end_coalescing(self, device=None) -> LinkEscapeWork:
        return self.end_coalescing(device)

    # ------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Close the communicator gracefully (peers see a clean goodbye)."""
        self._close(graceful=True)

    def abort(self) -> None:
        self._close(graceful=False)

    def _close(self, graceful: bool) -> None:
        with _live_lock:
            _live.pop(id(self), None)
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            return  # inherited through fork: the sockets belong to the parent
        try:
            if graceful:
                self._comm.close()
            else:
                self._comm.abort()
        except Exception:  # noqa: BLE001 - closing must not raise
            log.exception("closing %r failed", self)


# ---------------------------------------------------------------- exit
_atexit_done = False
_atexit_lock = threading.Lock()


def _ensure_atexit() -> None:
    global _atexit_done
    with _atexit_lock:
        if not _atexit_done:
            atexit.register(close_all)
            _atexit_done = True


def close_all() -> None:
    """Close every live process group of this process, then stop the
    completer thread (run at interpreter exit)."""
    with _live_lock:
        groups = list(_live.values())
    for pg in groups:
        pg._close(graceful=True)
    stop_completer()


def _after_fork_in_child() -> None:
    # groups of the parent are unusable here; forget them without touching
    # their sockets (a goodbye would reach the parent's peers)
    with _live_lock:
        for pg in _live.values():
            pg._closed = True
        _live.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["ProcessGroupLinkEscape", "BACKEND_NAME", "make_config", "close_all"]
