"""``ProcessGroupLinkEscape``: a ``torch.distributed.ProcessGroup`` over a
linkescape :class:`~linkescape.Communicator`.

Every method posts library operations with ``async_op=True`` and returns a
:class:`~linkescape.torch.work.LinkEscapeWork` at once; the library's
progress engine completes it, so DDP's gradient buckets overlap backward.

Each method accepts every argument form of the C++ ``ProcessGroup`` binding
(a list and an options object, a single tensor with keyword ``root``/``op``
and ``timeout``, or no options; see :mod:`.args`), brings it to one form,
and has the collective built as a :class:`~linkescape.torch.plan.Plan` by
:mod:`.collectives`, :mod:`.exchange` or :mod:`.sparse`; :meth:`_start`
posts the plan. The constructor returns once every link to every peer is
up (a barrier over them), as Gloo's eager connect does.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from ..comm.communicator import Communicator
from ..common.config import Config
from ..common.errors import CommClosed, LinkEscapeError, LinkFailure, PeerLost, UsageError
from . import args, collectives, convert, exchange, sparse
from .convert import reduce_op
from .plan import Plan
from .work import LinkEscapeBackendError, LinkEscapeWork, coalesced, stop_completer, wrap_error

log = logging.getLogger("linkescape.torch")

BACKEND_NAME = "linkescape"
_live: Dict[int, "ProcessGroupLinkEscape"] = {}
_live_lock = threading.Lock()


def get_communicator(group=None) -> Communicator:
    """The linkescape Communicator behind a process group (default: the
    world), e.g. for ``inject_fault`` or ``rail_bytes``."""
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
    supports_shrinking = True

    def __init__(self, pg: Optional["ProcessGroupLinkEscape"] = None) -> None:
        self._pg = pg

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, pg_options=None) -> "ProcessGroupLinkEscape":
        """What ``dist.shrink_group`` calls on the backend (only the ranks that stay call it)."""
        if self._pg is None:
            raise UsageError("this backend view belongs to no process group")
        return self._pg._shrink(list(ranks_to_exclude), shrink_flags, pg_options)

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
                 rails: Optional[Sequence[str]] = None, communicator: Optional[Communicator] = None) -> None:
        super().__init__(rank, size)
        self._le_rank = int(rank)
        self._le_size = int(size)
        self._group_name = group_name or ""
        self._group_desc = ""
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        #: this group's global ranks, by group rank. (``_global_ranks`` names the ranks of errors, which
        #: count as the first group of the communicator did: after a shrink, that group's list)
        self._group_globals = list(self._global_ranks)
        self._timeout_s = convert.seconds(timeout)
        self.config = config if config is not None else make_config(self._timeout_s)
        self._pid = os.getpid()
        self._coalescing: Optional[List[LinkEscapeWork]] = None
        self._tag_seq = 0
        self._closed = False
        if communicator is not None:  # a group made by a shrink: over the links of the group it came from
            self._comm = communicator
        try:
            if communicator is None:
                self._comm = Communicator(store, self._le_rank, self._le_size, rails=rails, config=self.config)
            # Gloo connects eagerly, so its constructor acts as a barrier and
            # callers rely on that (an RPC to a rank still in
            # init_process_group): return only once every rank is connected.
            # A start-up that ended at the store barrier (from 16 ranks on) is
            # one already: a collective barrier there would wait for the links
            # Recovery opens after it (32 ranks on 2 cores: 0.5 s more).
            if self._le_size > 1 and not self._comm.started_together and communicator is None:
                self._comm.barrier()
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

    def name(self) -> str:
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
        tensor allocation, shrinking): this group is its own backend for every device."""
        return _BackendInfo(self)

    def set_timeout(self, timeout) -> None:
        """The default timeout of later operations; it caps the no-path deadline too."""
        secs = convert.seconds(timeout)
        if secs is not None:
            self._timeout_s = secs
            self._comm.set_timeout(secs)

    # ------------------------------------------------------------ shrink
    def _shrink(self, excluded: List[int], flags: int, pg_options=None) -> "ProcessGroupLinkEscape":
        """``dist.shrink_group``: a group of the others over this group's links (see
        ``Communicator.shrink``). ``SHRINK_ABORT`` ends what is in flight first (it fails
        with ``GroupShrunk``); ``SHRINK_DEFAULT`` refuses while anything is. ``pg_options``
        cannot change a group that keeps its links: ignored."""
        self._check()
        abort = bool(int(flags) & getattr(dist.distributed_c10d, "SHRINK_ABORT", 1))
        try:
            comm = self._comm.shrink(excluded, abort=abort)
        except UsageError:
            raise
        except LinkEscapeError as exc:
            raise wrap_error(exc, "shrink", self._le_rank, self._group_name, self._global_ranks) from exc
        out = set(excluded)
        ranks = [g for i, g in enumerate(self._group_globals) if i not in out]
        with self._state_lock:
            works = list(self._inflight.values())
        for w in works:  # (the library failed their operations: the works say so now)
            w._fail(self._comm._closed_error)
        new = ProcessGroupLinkEscape(None, comm.rank, comm.world_size, self._timeout_s, group_name=self._group_name,
                                     global_ranks=ranks, config=comm.config, communicator=comm)
        new._global_ranks = list(self._global_ranks)  # (errors name ranks as the first group did)
        # this group's communicator is closed by the shrink (GroupShrunk); closing it closes nothing more
        return new

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

    def _start(self, name: str, build: Callable[[], Plan], collective: bool = True, source=-1,
               timeout: Optional[float] = None) -> LinkEscapeWork:
        """Build the plan, post its library operations, return the work.
        ``timeout`` (seconds, the call's own) bounds these operations instead
        of the group's timeout, as Gloo enforces a per-call timeout."""
        self._check()
        if collective and self._lost:
            exc = next(iter(self._lost.values()))
            raise wrap_error(exc, name, self._le_rank, self._group_name, self._global_ranks) from exc
        try:
            with self._comm.call_timeout(timeout):
                plan = build()
                parts = plan.start()
        except UsageError:
            raise
        except LinkEscapeError as exc:
            self._note_failure(exc)
            raise wrap_error(exc, name, self._le_rank, self._group_name, self._global_ranks) from exc
        if callable(source):
            source = source(parts)
        work = LinkEscapeWork(name, parts, plan.outputs, plan.finish(), rank=self._le_rank, group=self._group_name,
                              global_ranks=self._global_ranks, keep=plan.keep, source_rank=source,
                              value=plan.value)
        if collective and self._le_size > 1:
            self._track(work)
        else:
            work._listen(self._work_done)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _reserved_tag(self) -> int:
        """A p2p tag of the backend's own, the same on every rank for the
        same call (calls are made in the same order on every rank)."""
        self._tag_seq += 1
        return exchange.RESERVED_TAG_BASE + self._tag_seq % exchange.TAG_SPAN

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
        if not 0 <= root < self._le_size:
            raise UsageError(f"root {root} is not a rank of this group of {self._le_size}")
        return root

    # ------------------------------------------------------------ all_reduce
    def allreduce(self, tensors=None, opts=None, timeout=None, *, tensor=None, op=None) -> LinkEscapeWork:
        """``allreduce(tensors, opts)``, ``allreduce(tensors|tensor, op=, timeout=)``."""
        ts = args.tensor_list(tensors if tensors is not None else tensor, "all_reduce")
        red = reduce_op(args.reduce_op_of(opts, op))
        comm, rank, size = self._comm, self._le_rank, self._le_size
        if sparse.is_sparse(ts):
            return self._start("all_reduce", lambda: sparse.all_reduce(comm, rank, size, ts, red),
                               timeout=args.timeout_of(opts, timeout))
        return self._start("all_reduce", lambda: collectives.all_reduce(comm, size, ts, red),
                           timeout=args.timeout_of(opts, timeout))

    def allreduce_coalesced(self, tensors, opts=None) -> LinkEscapeWork:
        ts = args.tensor_list(tensors, "all_reduce_coalesced")
        red = reduce_op(args.reduce_op_of(opts))
        return self._start("all_reduce_coalesced", lambda: collectives.all_reduce_coalesced(self._comm, ts, red),
                           timeout=args.timeout_of(opts))

    # ------------------------------------------------------------ rooted
    def broadcast(self, tensors=None, opts=None, timeout=None, *, tensor=None, root=None) -> LinkEscapeWork:
        """``broadcast(tensors, opts)``, ``broadcast(tensor, root, timeout=)``."""
        ts = args.tensor_list(tensors if tensors is not None else tensor, "broadcast")
        r = self._root(args.root_of(opts, root))
        first = int(getattr(opts, "rootTensor", 0) or 0)
        return self._start("broadcast", lambda: collectives.broadcast(self._comm, self._le_rank, ts, r, first),
                           timeout=args.timeout_of(opts, timeout))

    def reduce(self, tensors=None, opts=None, op=None, timeout=None, *, tensor=None, root=None) -> LinkEscapeWork:
        """``reduce(tensors, opts)``, ``reduce(tensor, root, op=, timeout=)``."""
        ts = args.tensor_list(tensors if tensors is not None else tensor, "reduce")
        r = self._root(args.root_of(opts, root))
        red = reduce_op(args.reduce_op_of(None if isinstance(opts, int) else opts, op))
        return self._start("reduce", lambda: collectives.reduce(self._comm, self._le_rank, ts, r, red),
                           timeout=args.timeout_of(opts, timeout))

    def gather(self, output_tensors=None, input_tensors=None, opts=None, timeout=None, *, input_tensor=None,
               root=None) -> LinkEscapeWork:
        """``gather(output_lists, inputs, opts)``, ``gather(outputs, input_tensor, root, timeout=)``."""
        if input_tensor is not None or isinstance(input_tensors, torch.Tensor):
            inp = input_tensor if input_tensor is not None else input_tensors
            outs = args.tensor_list(output_tensors or [], "gather")
        else:
            ins = args.tensor_list(input_tensors, "gather")
            if len(ins) != 1:
                raise UsageError("gather takes exactly one input tensor")
            inp = ins[0]
            lists = list(output_tensors or [])
            if len(lists) > 1:
                raise UsageError("gather takes one list of output tensors")
            outs = args.tensor_list(lists[0], "gather") if lists else []
        r = self._root(args.root_of(opts, root))
        comm, rank, size = self._comm, self._le_rank, self._le_size
        return self._start("gather", lambda: collectives.gather(comm, rank, size, outs, inp, r),
                           timeout=args.timeout_of(opts, timeout))

    def scatter(self, output_tensors=None, input_tensors=None, opts=None, timeout=None, *, output_tensor=None,
                root=None) -> LinkEscapeWork:
        """``scatter(outputs, input_lists, opts)``, ``scatter(output_tensor, inputs, root, timeout=)``."""
        if output_tensor is not None or isinstance(output_tensors, torch.Tensor):
            out = output_tensor if output_tensor is not None else output_tensors
            ins = args.tensor_list(input_tensors or [], "scatter")
        else:
            outs = args.tensor_list(output_tensors, "scatter")
            if len(outs) != 1:
                raise UsageError("scatter takes exactly one output tensor")
            out = outs[0]
            lists = list(input_tensors or [])
            if len(lists) > 1:
                raise UsageError("scatter takes one list of input tensors")
            ins = args.tensor_list(lists[0], "scatter") if lists else []
        r = self._root(args.root_of(opts, root))
        comm, rank, size = self._comm, self._le_rank, self._le_size
        return self._start("scatter", lambda: collectives.scatter(comm, rank, size, out, ins, r),
                           timeout=args.timeout_of(opts, timeout))

    # ------------------------------------------------------------ all_gather
    def allgather(self, output_tensors, input_tensors=None, opts=None, *, input_tensor=None,
                  timeout=None) -> LinkEscapeWork:
        """``allgather(output_lists, inputs, opts)``, ``allgather(outputs, input_tensor, timeout=)``."""
        if input_tensor is not None or isinstance(input_tensors, torch.Tensor):
            ins = [input_tensor if input_tensor is not None else input_tensors]
            lists = [args.tensor_list(output_tensors, "all_gather")]
        else:
            ins = args.tensor_list(input_tensors, "all_gather")
            lists = [args.tensor_list(o, "all_gather") for o in output_tensors]
        comm, size = self._comm, self._le_size
        return self._start("all_gather", lambda: collectives.all_gather(comm, size, lists, ins),
                           timeout=args.timeout_of(opts, timeout))

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> LinkEscapeWork:
        lists = [args.tensor_list(o, "all_gather_coalesced") for o in output_lists]
        ins = args.tensor_list(input_list, "all_gather_coalesced")
        comm, size = self._comm, self._le_size
        return self._start("all_gather_coalesced", lambda: collectives.all_gather_coalesced(comm, size, lists, ins),
                           timeout=args.timeout_of(opts))

    def _gather_tensors(self, name: str, outputs, inputs, opts=None) -> LinkEscapeWork:
        pairs = args.flat_pairs(args.tensor_list(outputs, name), args.tensor_list(inputs, name), name)
        comm, size = self._comm, self._le_size

        def build() -> Plan:
            plan = Plan([o for o, _ in pairs])
            for o, i in pairs:
                collectives.all_gather_into_tensor(comm, plan, size, o, i)
            return plan
        return self._start(name, build, timeout=args.timeout_of(opts))

    def all_gather_single(self, output, input, opts=None) -> LinkEscapeWork:  # noqa: A002 - torch's name
        return self._gather_tensors("all_gather_into_tensor", [output], [input], opts)

    def _allgather_base(self, output, input, opts=None) -> LinkEscapeWork:  # noqa: A002
        return self.all_gather_single(output, input, opts)

    allgather_into_tensor = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> LinkEscapeWork:
        return self._gather_tensors("all_gather_into_tensor_coalesced", outputs, inputs, opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # ------------------------------------------------------------ reduce_scatter
    def reduce_scatter(self, output_tensors=None, input_tensors=None, opts=None, timeout=None, *, output=None,
                       input=None, op=None) -> LinkEscapeWork:  # noqa: A002 - torch's name
        """``reduce_scatter(outputs, input_lists, opts)``, ``reduce_scatter(output, inputs, op=, timeout=)``."""
        out_arg = output_tensors if output_tensors is not None else output
        in_arg = input_tensors if input_tensors is not None else input
        red = reduce_op(args.reduce_op_of(opts, op))
        if isinstance(out_arg, torch.Tensor):
            pairs = [(out_arg, args.tensor_list(in_arg, "reduce_scatter"))]
        else:
            outs = args.tensor_list(out_arg, "reduce_scatter")
            pairs = args.flat_pairs(outs, [args.tensor_list(i, "reduce_scatter") for i in in_arg], "reduce_scatter")
        comm, rank, size = self._comm, self._le_rank, self._le_size

        def build() -> Plan:
            plans = [collectives.reduce_scatter(comm, rank, size, o, ins, red) for o, ins in pairs]
            return plans[0] if len(plans) == 1 else _merge(plans)
        return self._start("reduce_scatter", build, timeout=args.timeout_of(opts, timeout))

    def _scatter_tensors(self, name: str, outputs, inputs, opts) -> LinkEscapeWork:
        pairs = args.flat_pairs(args.tensor_list(outputs, name), args.tensor_list(inputs, name), name)
        red = reduce_op(args.reduce_op_of(opts))
        comm, size = self._comm, self._le_size

        def build() -> Plan:
            plan = Plan([o for o, _ in pairs])
            for o, i in pairs:
                collectives.reduce_scatter_tensor(comm, plan, size, o, i, red)
            return plan
        return self._start(name, build, timeout=args.timeout_of(opts))

    def reduce_scatter_single(self, outputTensor, inputTensor, opts=None) -> LinkEscapeWork:  # noqa: N803
        return self._scatter_tensors("reduce_scatter_tensor", [outputTensor], [inputTensor], opts)

    def _reduce_scatter_base(self, outputTensor, inputTensor, opts=None) -> LinkEscapeWork:  # noqa: N803
        return self.reduce_scatter_single(outputTensor, inputTensor, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None) -> LinkEscapeWork:
        return self._scatter_tensors("reduce_scatter_tensor_coalesced", outputs, inputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ------------------------------------------------------------ all_to_all
    def alltoall(self, output_tensors=None, input_tensors=None, opts=None, timeout=None, *, output=None,
                 input=None) -> LinkEscapeWork:  # noqa: A002 - torch's name
        outs = args.tensor_list(output_tensors if output_tensors is not None else output, "all_to_all")
        ins = args.tensor_list(input_tensors if input_tensors is not None else input, "all_to_all")
        comm, rank, size, tag = self._comm, self._le_rank, self._le_size, self._reserved_tag()
        return self._start("all_to_all", lambda: exchange.all_to_all(comm, rank, size, outs, ins, tag),
                           timeout=args.timeout_of(opts, timeout))

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None,
                          timeout=None) -> LinkEscapeWork:  # noqa: A002 - torch's name
        out_splits = args.split_sizes(output_split_sizes, "all_to_all_single")
        in_splits = args.split_sizes(input_split_sizes, "all_to_all_single")
        comm, rank, size = self._comm, self._le_rank, self._le_size
        tag = self._reserved_tag() if (out_splits or in_splits) else 0
        return self._start("all_to_all_single", lambda: exchange.all_to_all_single(
            comm, rank, size, output, input, out_splits, in_splits, tag), timeout=args.timeout_of(opts, timeout))

    alltoall_base = all_to_all_single

    # ------------------------------------------------------------ barrier, p2p
    def barrier(self, opts=None, timeout=None) -> LinkEscapeWork:
        def build() -> Plan:
            plan = Plan()
            plan.issue(lambda: self._comm.barrier(async_op=True))
            return plan
        return self._start("barrier", build, timeout=args.timeout_of(opts, timeout))

    def send(self, tensors, dstRank=None, tag: int = 0, *, dst=None) -> LinkEscapeWork:  # noqa: N803
        ts = args.tensor_list(tensors, "send")
        peer = int(dstRank if dstRank is not None else dst)
        return self._start("send", lambda: exchange.send(self._comm, ts, peer, int(tag)), collective=False)

    def recv(self, tensors, srcRank=None, tag: int = 0, *, src=None) -> LinkEscapeWork:  # noqa: N803
        ts = args.tensor_list(tensors, "recv")
        peer = srcRank if srcRank is not None else src
        if peer is None:
            return self.recv_anysource(ts, tag)
        peer = int(peer)
        return self._start("recv", lambda: exchange.recv(self._comm, ts, peer, int(tag)), collective=False,
                           source=peer)

    def recv_anysource(self, tensors, tag: int = 0) -> LinkEscapeWork:
        """Receive from whichever rank's matching send comes first;
        ``work._source_rank()`` names it once the work is complete."""
        ts = args.tensor_list(tensors, "recv")
        if len(ts) != 1:
            raise UsageError("recv from any source takes exactly one tensor")
        return self._start("recv_anysource", lambda: exchange.recv(self._comm, ts, None, int(tag)),
                           collective=False, source=lambda parts: (lambda: getattr(parts[0], "source", -1)))

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


def _install_shrink_hook() -> None:
    """``dist.shrink_group`` registers the backend it gets in a new C++ ``ProcessGroup``
    (``_create_shrunk_process_group``), which takes only a C++ ``Backend``; a process group
    written in Python is its own backend (``_new_process_group_helper`` returns such a
    group itself for the same reason). So for a linkescape group the new group is the one
    ``shrink`` returned, named as torch names a shrunk group; any other goes to torch's."""
    c10d = dist.distributed_c10d
    create = getattr(c10d, "_create_shrunk_process_group", None)
    if create is None or getattr(create, "_linkescape", False):
        return

    def create_shrunk(new_backend, remaining_ranks, metadata, is_default_group):
        if not isinstance(new_backend, ProcessGroupLinkEscape):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc("default:shrunken" if is_default_group
                                    else f"{metadata['original_group_name']}:shrunk")
        if metadata.get("bound_device_id") is not None:
            new_backend.bound_device_id = metadata["bound_device_id"]
        if metadata.get("backend_config") is not None:
            c10d._world.pg_backend_config[new_backend] = metadata["backend_config"]
        return new_backend

    create_shrunk._linkescape = True
    c10d._create_shrunk_process_group = create_shrunk


_install_shrink_hook()


def _merge(plans: List[Plan]) -> Plan:
    """Several plans as one operation."""
    out = Plan([t for p in plans for t in p.outputs])
    for p in plans:
        out.issue(p.start)
        fin = p.finish()
        if fin is not None:
            out.then(fin)
        out.keep.append(p.keep)
    return out


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


__all__ = ["ProcessGroupLinkEscape", "BACKEND_NAME", "make_config", "close_all", "get_communicator"]
