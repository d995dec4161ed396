"""The progress engine: a small loop over peers, descriptors and timers.

- Each peer (``PeerChannel``) owns its links, its route and its data path;
  the engine polls their sockets, hands each event to the peer that owns the
  link, and applies what the peer reports (``outcomes``), in order, after
  the call: the engine is the only place where one peer's events act on the
  rest of the rank (operations, other peers, relays, liveness, recovery).
- Operations in flight live in an ``OpTable``; verdicts on peers without a
  path come from ``Liveness``; relays from the ``RelayRouter``. Who drives
  progress (a waiting caller or the background thread) is the ``Driver``'s
  business, which also holds the lock every state change happens under.
- Nothing here runs per peer or per link on a clock: the timers look only
  at the *hot* peers (an operation pending with them, bytes of ours waiting
  for their kernel's ack, a fault being handled, a rail in hold-down), and
  wake the loop only while one is hot or when the probe budget is due.
  Idle and backup links are checked a fixed number a second per rank
  (``ProbeBudget``), whatever the number of peers.
- Time comes from ``self.clock`` (``clock.py``).
"""

from __future__ import annotations

import collections
import logging
import select
import socket
from typing import Callable, Dict, List, Optional

from ..common.config import Config
from ..common.errors import CommClosed, LinkEscapeError, PeerLost, ProtocolError
from ..protocol.channel import address_range
from ..protocol.frames import BYE, NOTIFY_DOWN, NOTIFY_UP, PEER_LOST, RELAY_RESET, RELAY_UNREACH
from ..protocol.grey import RailRate
from ..protocol.linkstate import Ev, PathPolicy
from ..protocol.railstate import RailWord
from ..transport.tcp import ack_silence
from .clock import SYSTEM, Clock
from .beacon import Beacon
from .completion import OpTable
from .io import IoSet, Signal
from .heap import HeapTrimmer, pin_thresholds
from .link import Link
from .liveness import PROBE, Expired, Gone, Liveness
from .messages import ANY_SOURCE, Op, enqueue
from .outcomes import (Closed, Emit, Fatal, Forward, LinkDown, LinkUp, LostReported, NoPath, OpFailed, PathBack,
                       RecvDone, Redial, Relayed, RelayEnded, RelayReset, Unreachable)
from .env import INF, Matcher, PeerEnv
from .peer import PeerChannel
from .probes import ProbeBudget
from .greywatch import sample_grey
from .peer_table import PeerTable
from .relay import RelayRouter


log = logging.getLogger("linkescape.engine")

#: seconds between two goodput samples of the links (grey failure), while
#: some link carries bulk (GREY_BULK bytes or more in a sample, busy); else the
#: samples are taken when the timers run for something else
GREY_INTERVAL = 0.1
#: timer cadence while a fault is handled with some hot peer (no path, EOF,
#: a rail held out, parked or stashed frames, a relay)
TICK = 0.01
#: the longest the timers sleep while a hot peer is not settled (a rail in
#: hold-down, a path the policy would change: ``PeerChannel.settled``). A
#: settled one's timers run only when due: silence checks, heartbeats, an
#: owed ack (need_ack operations ask for theirs at once)
TICK_IDLE = 0.04
#: the timers' deadlines are met within this (one round for those that fall close together)
TIMER_SLACK = 0.004
#: peers with a rail down whose remaining links carry heartbeats (the rest: the probe budget)
WATCH_DEGRADED = 8
#: seconds between two searches for a relay for a peer without a path
RELAY_RETRY = 0.5
#: events that end an outage: what it made the rank hold has been freed, so
#: the heap is trimmed (by Recovery, at most once a second: engine/heap.py)
OUTAGE_ENDS = frozenset({"link_up", "failback", "relay_off"})


class Engine:
    def __init__(self, rank: int, world_size: int, nrails: int, config: Config, events=None,
                 clock: Clock = SYSTEM, store=None, record_key=None, tcp_probe=ack_silence,
                 peers_now: Optional[set] = None, keys=None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.nrails = nrails
        self.config = config
        self.events = events
        self.clock = clock
        self.io = IoSet()
        #: whoever drives progress runs these under the lock (``call_soon``)
        self._soon: "collections.deque" = collections.deque()
        #: wakes Recovery (a link went down, a peer's NIC came back, a heap trim is wanted)
        self.recovery_signal = Signal()
        self.heap = HeapTrimmer(config.malloc_trim)
        if config.malloc_thresholds:
            pin_thresholds()
        self.policy = PathPolicy(primary=0, holddown=config.failback_holddown, stripe=config.policy == "stripe")
        #: our rails without carrier; every frame carries the word (level state)
        self.rail_word = RailWord()
        #: healthy goodput per rail (grey-failure reference), shared by its links
        self.rail_rates = [RailRate() for _ in range(nrails)]
        self.matcher = Matcher()
        self.peers: Dict[int, PeerChannel] = PeerTable(range(world_size), rank, self._build_peer)
        #: a peer built from now on has its links marked for Recovery (False: start-up, whose links the
        #: communicator opens or marks itself)
        self._await_built = False
        self.relays = RelayRouter(rank, self.peers, self.rail_word, config.relay_window, clock)
        self.env = PeerEnv(rank, nrails, config, clock, self.io, self.policy, self.rail_word, self.rail_rates,
                           self.matcher, self.protect_range, self.relays.admit, tcp_probe, keys)
        for p in range(world_size):
            if p != rank and (peers_now is None or p in peers_now):
                self.peers[p] = PeerChannel(p, self.env)
        self.ops = OpTable(self.peers, self.matcher, clock)
        self.ops.on_timeout = self._timed_out
        #: liveness and root causes through the store (None: no store)
        self.beacon = None
        if store is not None and record_key is not None and world_size > 1:
            self.beacon = Beacon(rank, store, record_key, clock, config.peer_lost_timeout,
                                 on_record=self.failure_record, failed=lambda: self.fatal is not None)
        self.liveness = Liveness(rank, nrails, config, clock, self.beacon)
        self.fatal: Optional[BaseException] = None
        self.closed = False
        #: ranks a shrink left out (``membership.py``): never dialed, adopted or believed again
        self.excluded: set = set()
        #: rank -> LinkFailure, members past the no-path deadline: every collective fails at once
        #: (it cannot complete without them) until a shrink leaves them out
        self.expired: Dict[int, BaseException] = {}
        #: peers the timers look at (see ``PeerChannel.quiet``); every other peer costs nothing
        self.hot: set = set()
        #: links that are down, as (peer, rail): what Recovery re-dials, without a scan of all peers
        self.down: set = set()
        #: peers that lost a rail and whose remaining links are watched closely
        #: (heartbeats): a second fault on them is the one that leaves no path.
        #: At most WATCH_DEGRADED, so a NIC failure facing N peers costs O(1).
        self.degraded_watch: set = set()
        #: peers whose listeners Recovery should probe (every link ended with FIN/RST)
        self._probe_wanted: set = set()
        #: idle and backup links are checked this many a second per rank, whatever N
        self.probes = ProbeBudget([p for p in range(world_size) if p != rank], nrails, config.probe_rate)
        #: the link probed last: (peer, link), its acknowledgement looked at with the next probe
        self._probed = None
        #: links of an emulated cut being taken down now (see ``local_rail_down``)
        self._severed: List[Link] = []
        #: peers without a path, and when a relay was last looked for
        self._relay_search: Dict[PeerChannel, float] = {}
        self.next_timer = 0.0
        self._next_grey = 0.0
        #: the last goodput sample found a busy or held link: the next one is a deadline
        #: (otherwise it is taken whenever the timers run)
        self._grey_busy = False

    # ------------------------------------------------------------ for the Driver and other threads
    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the lock in the next progress round, from any
        thread, without waiting for the lock (the driver may hold it for long)."""
        self._soon.append(fn)
        self.io.wake()

    def _run_soon(self) -> None:
        soon = self._soon
        while soon:
            fn = soon.popleft()
            try:
                fn()
            except LinkEscapeError as exc:
                self.set_fatal(exc)

    def async_work(self) -> bool:
        """(any thread, without the lock: the driver asks) Work for the
        background thread. A copy of the hot set: it changes under the lock."""
        if self.ops:
            return True
        for p in tuple(self.hot):
            if p.output_pending() or p.receiving():
                return True
        return False

    def wake(self) -> None:
        self.io.wake()

    def timers_wanted(self) -> bool:
        """(lock held) A deadline was asked for since the last round (``PeerEnv.soon``):
        whoever polls next must know of it."""
        return self.env.wakeup.at < INF

    def start(self) -> None:
        """Connected: the beacon's thread may start."""
        if self.beacon is not None:
            self.beacon.start()

    # ------------------------------------------------------------ links and descriptors (lock held)
    def open_links(self, links: List[Link]) -> None:
        """The links opened at start-up."""
        for link in links:
            peer = self.peers[link.peer]
            self._apply(peer, peer.open_link(link))

    def start_links(self, links: List[Link]) -> None:
        """Start-up: put its links in service; every other link of every peer (the
        backups, and the peers start-up did not connect) is opened by Recovery, those of
        a peer built later (``PeerTable``) as soon as it is built."""
        self.open_links(links)
        opened = {(link.peer, link.rail) for link in links}
        self.await_links([(rank, rail) for rank in self.peers for rail in range(self.nrails)
                          if (rank, rail) not in opened])
        self._await_built = True

    def _build_peer(self, rank: int) -> PeerChannel:
        peer = self.peers[rank] = PeerChannel(rank, self.env)
        if self._await_built:
            self.await_links([(rank, rail) for rail in range(self.nrails)])
        return peer

    def build_peers(self) -> None:
        """(lock held) Build every peer start-up did not (``Engine(peers_now=)``): their
        links are opened by Recovery from then on. O(N) once, by the progress thread
        after the start-up barrier, off the caller's path."""
        peers = self.peers
        for rank in range(self.world_size):
            if rank != self.rank and rank not in peers:
                peers[rank]  # noqa: B018 - the lookup builds it

    def await_links(self, pairs) -> None:
        """Links not opened at start-up (the backups): Recovery opens them
        now, as it re-opens links that went down (no event: they never failed)."""
        now = self.clock.now()
        for rank, rail in pairs:
            self.peers[rank].paths.await_first(rail, now)
            self.down.add((rank, rail))
        if pairs:
            self.recovery_signal.set()

    def adopt(self, link: Link, peer_expected: int) -> None:
        """A re-opened link (either side dialed): put it in service."""
        if self.closed or link.peer in self.excluded:
            link.close()  # (a rank left out by a shrink that dialed again)
            return
        peer = self.peers[link.peer]
        self._apply(peer, peer.open_link(link, peer_expected))

    def local_rail_down(self, rail: int, ev: Ev, detail: str, notify: bool, close: bool = True) -> List[Link]:
        """This rank's NIC on ``rail`` is unusable: every link on it goes down
        at once, told to the peers that have one on it (first, so they learn
        it before anything else happens) when ``notify``. Returns the links of
        an emulated cut (``close=False``), left open and unused."""
        if ev is Ev.CARRIER_DOWN:
            self.rail_word.set(rail, True)  # every frame from now on says so
        self.env.update(local_down=self.env.local_down | 1 << rail)
        peers = [p for p in self.peers.values() if p.links[rail] is not None]
        if notify:
            for peer in peers:
                self._apply(peer, peer.notify(NOTIFY_DOWN, rail))
        for peer in peers:
            self._apply(peer, peer.link_failed(rail, ev, detail, close=close))
        severed, self._severed = self._severed, []
        return severed

    def local_rail_up(self, rail: int) -> None:
        """Our NIC on ``rail`` is back: retry its links at once, tell the peers."""
        self.rail_word.set(rail, False)
        self.env.update(local_down=self.env.local_down & ~(1 << rail))
        for peer_rank, r in list(self.down):
            if r == rail:
                peer = self.peers[peer_rank]
                if peer.rail_back(rail):
                    self._apply(peer, peer.notify(NOTIFY_UP, rail))
        self.recovery_signal.set()

    def set_rail_state(self, rail: int, down: bool) -> None:
        """Record our NIC on ``rail`` as down or up in the word every frame carries."""
        self.rail_word.set(rail, down)
        if down:
            self.env.update(local_down=self.env.local_down | 1 << rail)
        else:
            self.env.update(local_down=self.env.local_down & ~(1 << rail))

    def dial_failed(self, peer_rank: int, rail: int, refused: bool, answered: bool = False) -> None:
        """A re-dial failed: ``refused`` (nobody listens), or ``answered`` (the peer's kernel
        accepted the connection, the handshake did not complete)."""
        peer = self.peers[peer_rank]
        peer.paths.dial_failed(rail, self.clock.now(), peer.stranded)
        self.listener_probed(peer_rank, rail, refused, answered)

    def listener_probed(self, peer_rank: int, rail: int, refused: bool, answered: bool = False) -> None:
        peer = self.peers[peer_rank]
        self._verdict(peer, self.liveness.listener_probed(peer, rail, refused, answered))

    def down_links(self) -> List[tuple]:
        """(any thread, no lock) (peer, rail, next try, never up yet) of the down links this
        rank re-dials (it is the higher rank of the pair): a copy, states
        re-checked, only the links that are down looked at."""
        out = []
        for rank, rail in list(self.down):
            if rank < self.rank:
                due = self.redial_due(rank, rail)
                if due is not None:
                    out.append((rank, rail) + due)
        return out

    def redial_due(self, peer_rank: int, rail: int) -> Optional[tuple]:
        """(any thread, no lock) (next try, never up yet) of a link this rank re-dials
        that is down now; None when it is not."""
        peer = self.peers.get(peer_rank)
        if peer is None or peer.lost is not None:
            return None
        return peer.paths.redial_due(rail)

    def stranded(self, peer_rank: int) -> bool:
        """(any thread, no lock) ``peer_rank`` has no rail and no relay now: its re-dials
        go at the stranded pace (engine/peer.py, STRANDED_CONNECT)."""
        peer = self.peers.get(peer_rank)
        return peer is not None and peer.stranded

    def expected_from(self, peer_rank: int) -> int:
        """(any thread) The next seq we expect from the peer (a racy read of an
        int: a replay then trims less); 1 for a peer not built yet (nothing came from
        it: building it is the engine's, under its lock)."""
        peer = self.peers.get(peer_rank)
        return 1 if peer is None else peer.inbound.expected

    def probes_wanted(self) -> List[int]:
        """(any thread, no lock) The peers whose listeners Liveness asked to probe."""
        return list(self._probe_wanted)

    def probe_taken(self, peer_rank: int) -> None:
        """(recovery thread) ``peer_rank``'s listeners are being probed: one probe per request
        (Liveness asks again on its next look while it still needs one)."""
        self._probe_wanted.discard(peer_rank)

    def add_fd(self, fd: int, handler: Callable[[int], None]) -> None:
        """Watch another descriptor (the carrier monitor), set up before progress starts."""
        self.io.add_fd(fd, handler)
        self.wake()

    def heap_due(self) -> Optional[float]:
        """(Recovery) When the heap an outage freed goes back to the system (engine/heap.py)."""
        return self.heap.due()

    def trim_heap(self, now: float) -> None:
        """(Recovery's thread, off the lock) Give the freed heap back if it is due."""
        self.heap.run(now)

    def remove_fd(self, fd: int) -> None:
        self.io.remove_fd(fd)

    # ------------------------------------------------------------ outcomes
    def _apply(self, peer: PeerChannel, outcomes) -> None:
        """What ``peer`` reported, in order."""
        self.hot.add(peer)
        for o in outcomes:
            t = type(o)
            if t is RecvDone:
                self.ops.recv_done(o.message)
                continue
            # anything else changed what the timers look at: they run in this round
            self.env.soon(0.0)
            if t is Emit:
                self.emit(o.event, peer.rank, o.rail, o.cause, **o.extra)
            elif t is LinkDown:
                self._link_down(peer, o)
            elif t is LinkUp:
                self.down.discard((peer.rank, o.rail))
                self.liveness.link_up(peer, o.rail)
                if peer.whole:
                    self.degraded_watch.discard(peer)
            elif t is Redial:
                self.recovery_signal.set()
            elif t is NoPath:
                self._no_path(peer)
            elif t is PathBack:
                self._relay_search.pop(peer, None)
                self.liveness.path_back(peer)
            elif t is OpFailed:
                self.ops.fail(o.op, o.error)
            elif t is Fatal:
                self.set_fatal(o.error)
            elif t is Closed:
                self.ops.fail_needing(peer, o.error)
            elif t is LostReported:
                self.root_cause(self.liveness.reported(peer.rank, o.lost_rank))
            elif t is Forward:
                self._forward(peer, o.dst, o.frame)
            elif t is Relayed:
                if o.src in self.excluded:
                    continue  # a rank left out: nothing it sends is taken (engine/membership.py)
                src = self.peers.find(o.src)  # (a peer not built yet is built now)
                if src is not None:
                    try:
                        out = src.on_relayed(o.frame)
                        self.relays.saw(peer.rank, o.src)
                    except ProtocolError as exc:  # the relay's doing: its link, not src's
                        self._apply(peer, peer.bad_relayed(o.link, exc))
                        self._apply(src, src.relay_broke(peer.rank))
                        continue
                    lost = any(type(x) is RelayEnded for x in out)
                    self._apply(src, out)
                    if src.relay is None and src.no_path_since is not None and not lost:
                        # it reached us through this peer: our frames can go back the same way
                        self._find_relay(src, through=peer.rank)
            elif t is Unreachable:
                self._unreachable(peer, o.dst)
            elif t is RelayEnded:
                self._relay_ended(peer, o)
            elif t is RelayReset:
                dst = self.peers.get(o.dst)
                if dst is not None and dst.relay is not None and dst.relay.via == peer.rank:
                    self._apply(dst, dst.replay_now())

    def _link_down(self, peer: PeerChannel, o: LinkDown) -> None:
        rail = o.link.rail
        self.down.add((peer.rank, rail))
        # the rank is not calm any more: every busy pair's backups beat each interval (PeerTimers.calm)
        self.env.update(fault_at=self.clock.now())
        if o.severed:
            self._severed.append(o.link)
        if len(self.degraded_watch) < WATCH_DEGRADED:
            self.degraded_watch.add(peer)
        # Frames of other pairs we were passing on to this peer went down with the link.
        for src in self.relays.sources_for(peer.rank):
            s = self.peers[src]
            self._apply(s, s.tell(RELAY_RESET, peer.rank))
        # So did our own frames for the pairs we route through this peer (RELAY frames in the
        # link's socket): they go again on its other links. (Nobody else would say they were lost:
        # the peer's ack stands still, and a peer that now answers directly never shows as heard
        # through the relay; a pair stalled until it left the relay.)
        for dst in self.relays.relayed_through(peer.rank):
            d = self.peers[dst]
            if d.relay is not None and d.relay.via == peer.rank:
                self._apply(d, d.replay_now())

    def _no_path(self, peer: PeerChannel) -> None:
        # Peers we relay through this one lost their path too.
        for dst in self.relays.relayed_through(peer.rank):
            d = self.peers[dst]
            self._apply(d, d.relay_lost(peer.rank, "via_lost"))
        self._find_relay(peer)

    def _find_relay(self, peer: PeerChannel, through: Optional[int] = None) -> None:
        if peer.lost is not None or self.closed or peer.relay is not None or peer.active:
            self._relay_search.pop(peer, None)
            return
        self._relay_search[peer] = self.clock.now()
        path = self.relays.choose(peer.rank, through)
        if path is not None:
            self._apply(peer, peer.use_relay(path))

    def _forward(self, src: PeerChannel, dst_rank: int, frame: memoryview) -> None:
        """(relay) Pass a frame of ``src`` on to ``dst_rank``."""
        dst = self.peers.get(dst_rank)
        link = self.relays.forward(src.rank, dst_rank, frame) if dst is not None else None
        if link is None:
            self._apply(src, src.tell(RELAY_UNREACH, dst_rank))
        else:
            self.env.update(relaying=self.relays.pairs())
            self._apply(dst, dst.flush(link))
        self._resume_unblocked()

    def _resume_unblocked(self) -> None:
        """(relay) Sources parked on a full window read on once it opened."""
        for rank in self.relays.take_unblocked():
            if rank in self.excluded:
                continue
            p = self.peers[rank]
            self._apply(p, p.resume())

    def _unreachable(self, via: PeerChannel, dst_rank: int) -> None:
        dst = self.peers.get(dst_rank)
        self.relays.refused(dst_rank, via.rank)
        if dst is not None:
            self._apply(dst, dst.relay_lost(via.rank, "unreachable"))

    def _relay_ended(self, peer: PeerChannel, o: RelayEnded) -> None:
        """The relay through ``o.path.via`` ended. Lost: while no rail is back,
        the next rank is asked now, not at the next search (RELAY_RETRY later:
        a pair whose relay went silent or lost its own path stalled 0.5 s), and
        the rank that failed us is not asked first, whatever the cause."""
        self.relays.ended(peer.rank, o.path)
        if o.why == "path_back":
            return
        self.relays.refused(peer.rank, o.path.via)
        if peer.relay is None and peer.no_path_since is not None:
            self._find_relay(peer)

    def _verdict(self, peer: PeerChannel, verdict) -> None:
        if verdict is None:
            return
        if verdict is PROBE:
            if peer.rank not in self._probe_wanted:
                self._probe_wanted.add(peer.rank)
                self.recovery_signal.set()
        elif isinstance(verdict, Gone):
            self._lost(peer, verdict.error, verdict.cause)
        elif isinstance(verdict, Expired):
            peer.lost = verdict.error
            self.expired[peer.rank] = verdict.error
            self.ops.fail_needing(peer, verdict.error)
            # a collective needs every member, also through the others: it fails on this rank now,
            # named after the rank without a path, not after its timeout
            for op in [op for op in self.ops.ops if op.collective]:
                self.ops.fail(op, verdict.error)

    def _timed_out(self, op: Op) -> Optional[BaseException]:
        """``op`` is past its timeout. A member it needs that has had no path for half the
        no-path deadline or more (which the group's timeout caps) is past the deadline now, as far
        as any call goes: it expires (LinkFailure, named), so that this rank's next collective is
        refused at once rather than sent to ranks still waiting in this one (they would take it
        for a mismatch)."""
        now = self.clock.now()
        half = self.liveness.no_path_deadline / 2
        error = None
        for peer in list(self.hot):
            since = peer.no_path_since
            if since is None or peer.relay is not None or peer.lost is not None or now - since < half:
                continue
            if not op.collective and peer.rank not in op.peers:
                continue
            verdict = self.liveness.expired(peer, now)
            self._verdict(peer, verdict)
            error = error or verdict.error
        return error

    def _lost(self, peer: PeerChannel, error: PeerLost, cause: str) -> None:
        """``peer`` is gone. Tell the other ranks first (over surviving links,
        and the store), then fail: they name it too, not us."""
        peer.lost = error
        self.emit("peer_lost", peer.rank, -1, cause, detail=str(error))
        if self.fatal is None:
            for other in list(self.peers.values()):  # (what is applied may build a peer)
                if other is not peer and other.lost is None:
                    self._apply(other, other.tell_all_links(PEER_LOST, peer.rank))
            if self.beacon is not None:
                self.beacon.report_failure(peer.rank, error)
        # A collective cannot complete without one of its members: every
        # operation fails now rather than waiting for its deadline.
        self.set_fatal(error)

    def root_cause(self, error: Optional[PeerLost]) -> None:
        """Another rank found ``error.peer`` lost (a PEER_LOST frame, or the
        store's failure record): fail with it as the root cause."""
        if error is None or self.fatal is not None or self.closed or error.peer in self.excluded:
            return
        peer = self.peers.find(error.peer)
        if peer is not None and peer.lost is None:
            peer.lost = error
            self.emit("peer_lost", error.peer, -1, "socket_error", detail=str(error))
        self.set_fatal(error)

    def failure_record(self, record: dict) -> None:
        """(beacon thread) An authentic failure record of another rank."""
        if record.get("by") in self.excluded:
            return  # a rank left out by a shrink: what it says of the survivors is no evidence
        self.call_soon(lambda: self.root_cause(self.liveness.recorded(record)))

    # ------------------------------------------------------------ services
    def emit(self, event: str, peer: int, rail: int, cause: Optional[str], **extra) -> None:
        if event in OUTAGE_ENDS and self.heap.request():
            self.recovery_signal.set()  # Recovery gives the outage's freed heap back (engine/heap.py)
        if self.events is not None:
            try:
                self.events.emit(event, peer=peer, rail=rail, cause=cause, **extra)
            except Exception:  # noqa: BLE001 - the event trail must never break the data path
                log.exception("event %s could not be recorded", event)
        else:
            log.info("%s peer=%s rail=%s cause=%s %s", event, peer, rail, cause, extra)

    def protect_range(self, view: memoryview) -> None:
        """Before caller memory is overwritten, turn zero-copy frames that
        point into it into copies, so a replay sends the original bytes."""
        lo = None
        for peer in tuple(self.hot):  # a peer with zero-copy frames unacknowledged is hot
            if peer.outbound.zc:
                if lo is None:
                    if not len(view):
                        return
                    lo, hi = address_range(view)
                peer.materialize(lo, hi)

    def set_fatal(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("communicator failed: %s", exc)
        self.ops.fail_all(exc)

    # ------------------------------------------------------------ operations (lock held)
    def start_locked(self, op: Op) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.closed:
            raise CommClosed("communicator is closed")
        if op.collective and self.expired:
            raise next(iter(self.expired.values()))
        peers = self.peers
        closed = None
        for m in op.sends:
            peer = peers[m.peer]
            if peer.lost is not None:
                raise peer.lost
            op.peers.add(m.peer)
        for m in op.recvs:
            if m.peer == ANY_SOURCE:
                continue
            peer = peers[m.peer]
            if peer.lost is not None:
                if not peer.closed_by_peer:
                    raise peer.lost
                # it said BYE after sending everything: what it sent may still be taken
                closed = (closed or []) + [peer]
            op.peers.add(m.peer)
        for m in op.sends:
            peers[m.peer].post_send(m)
        for m in op.recvs:
            if m.peer == ANY_SOURCE:
                self._post_any(m)
            else:
                peers[m.peer].post_recv(m)
        self.ops.add(op)
        if op.collective:
            self.matcher.coll_started = op.seq
        for peer in closed or ():
            self.ops.fail_needing(peer, peer.lost)
        for p in op.peers:
            peer = peers[p]
            self._apply(peer, peer.posted())
        self.ops.check(op, self.clock.now())

    def _post_any(self, m) -> None:
        # a whole message that waits already (the earliest of any peer's) is taken at once
        for peer in self.peers.values():
            if peer.take_any(m):
                self._apply(peer, peer.pump())
                return
        enqueue(self.matcher.any_recvs, m.msg, m)

    # ------------------------------------------------------------ one round (lock held)
    def progress_once(self, timeout: float) -> None:
        """One round: poll, read, write, timers."""
        io = self.io
        wake = self.env.wakeup.at
        if wake < INF:
            # a deadline asked for since the last round (an op posted before this
            # poll sent bytes that now wait for an ack): the poll must not outsleep it
            timeout = min(timeout, wake - self.clock.now())
        events = io.poll(timeout)
        if self._soon:
            self._run_soon()
        links = io.links
        peers = self.peers
        for fd, ev in events:
            link = links.get(fd)
            if link is None:
                if io.is_wake(fd):
                    io.drain_wake()
                else:
                    handler = io.extra.get(fd)
                    if handler is not None:
                        handler(ev)
                continue
            peer = peers[link.peer]
            self._apply(peer, peer.on_event(link, ev))
        if self.relays.blocked:
            # a relayed pair's window opened as its frames were written on (not only when
            # another frame comes to be forwarded: there may be none while the source is parked)
            self._resume_unblocked()
        now = self.clock.now()
        hot = self.hot
        if hot:
            for peer in list(hot):
                if peer.wants_pump():
                    self._apply(peer, peer.pump())
        if self.ops:
            self.ops.check_all(now)
        # deadlines set in this round (bytes of ours now wait for an ack, an ack
        # is owed, a peer's state changed); the timers re-derive them all
        env = self.env
        wake = env.wakeup.take()
        if now >= self.next_timer or wake <= now:
            self._timers(now)
        elif wake < self.next_timer:
            self.next_timer = wake

    def _timers(self, now: float) -> None:
        # If this rank ran later than its timers were due by more than the
        # silent timeout (descheduled, stopped, a long GIL hold), nothing was
        # observed meanwhile: start watching afresh. (Shorter gaps are the
        # normal life of a rank on a loaded host; treating them as blindness
        # would mean never finding a silent link there.)
        blind = now - self.next_timer > self.config.silent_timeout
        hot = self.hot
        soon = self.probes.next_at
        if self._grey_busy:
            soon = min(soon, self._next_grey)
        watch = self.degraded_watch
        exact = False  # a fault is being handled: its rounds are not put off
        for peer in list(hot):
            due, out = peer.tick(now, blind, soon, peer in watch)
            soon = due
            self._apply(peer, out)
            if peer.handling():
                soon = min(soon, now + TICK)
                exact = True
            elif not peer.settled(now):
                soon = min(soon, now + TICK_IDLE)
            if peer.no_path_since is not None:
                self._verdict(peer, self.liveness.check(peer, now))
                if peer.relay is None and now - self._relay_search.get(peer, 0.0) >= RELAY_RETRY:
                    self._find_relay(peer)
            else:
                self._apply(peer, peer.failback(now))
        if hot and now >= self._next_grey:
            self._next_grey = now + GREY_INTERVAL
            self._grey_busy = self._grey(now)
        due = self.probes.due(now)
        if due is not None:
            self._probe(due, now)
        for peer in [p for p in hot if p.quiet(now, p in watch)]:
            hot.discard(peer)
        if hot:
            # (while no fault is handled, rounded up to the slack's grid: the deadlines of several
            # links and peers that fall within a few ms of each other, the heartbeats of busy pairs'
            # links among them, are met by one round instead of one each)
            nxt = max(soon, now + 0.001)
            self.next_timer = nxt if exact else nxt + (-nxt % TIMER_SLACK)
        else:
            self.next_timer = self.probes.next_at

    def _probe(self, due, now: float) -> None:
        """The probe budget is due: look at the last probe's acknowledgement
        (a link still silent makes its peer hot: the silence check takes it
        from there), then probe the next link. A probed peer is not made hot,
        so a probe costs one wake-up here (and two at the peer: the frame,
        then the timer round that finds it quiet)."""
        last, self._probed = self._probed, None
        if last is not None:
            peer, link = last
            if link.open and link.pending_since is not None and peer not in self.hot:
                try:
                    silent = self.env.ack_silence(link.sock)
                except OSError:
                    silent = 0.0
                if silent is None:
                    link.pending_since = None
                else:
                    self.hot.add(peer)
        peer = self.peers[due[0]]
        if peer not in self.hot:
            link = peer.probe(due[1], now)
            if link is not None:
                self._probed = (peer, link)

    def _grey(self, now: float) -> bool:
        """Grey failure, per rail (engine/greywatch.py): True when a link was held or busy."""
        return sample_grey(self.hot, self.rail_rates, now, self._apply)

    # ------------------------------------------------------------ operators' view (lock held)
    def rail_totals(self) -> List[tuple]:
        """(sent, received) bytes per rail, over every link ever opened on it."""
        sent, received = [0] * self.nrails, [0] * self.nrails
        for peer in self.peers.values():
            for rail in range(self.nrails):
                s, r = peer.rail_bytes(rail)
                sent[rail] += s
                received[rail] += r
        return list(zip(sent, received))

    def snapshot(self) -> dict:
        """A copy of this rank's link and channel state (metrics, status, flight recorder)."""
        now = self.clock.now()
        frames_sent = frames_received = 0
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    frames_sent += link.frames_sent
                    frames_received += link.frames_received
        relay_bytes = {f"{dst}:{via}": n for (dst, via), n in self.relays.sent_total.items()}
        for peer in self.peers.values():
            if peer.relay is not None:
                key = f"{peer.rank}:{peer.relay.via}"
                relay_bytes[key] = relay_bytes.get(key, 0) + peer.relay.bytes
        return {"rank": self.rank, "world_size": self.world_size, "rails": self.nrails,
                "ops_pending": len(self.ops), "hot_peers": len(self.hot),
                "wakeups": self.io.wakeups, "frames_sent": frames_sent, "frames_received": frames_received,
                "relayed_pairs": self.relays.pairs(), "relay_bytes": relay_bytes,
                "peers": {rank: peer.snapshot(now) for rank, peer in self.peers.items()}}

    # ------------------------------------------------------------ closing (lock held)
    def close_locked(self, graceful: bool = True, drain: float = 10.0) -> None:
        """Graceful: deliver everything still unacknowledged, say BYE on every
        link, half-close and wait for the peer's EOF, so no RST can destroy
        bytes the peer has not read yet."""
        if self.closed:
            return
        if graceful and self.fatal is None:
            # links that a dial or an accept finished and no round adopted yet (a rank closing right
            # after start-up, its backups just opened): in service now, so they get a BYE too. Closed
            # without one, the peer that adopted its end saw a reset, found us refusing every rail,
            # and failed with PeerLost although we had left in good order
            self._run_soon()
            self._drain(self.clock.now() + drain)
            self._goodbye(self.clock.now() + 2.0)
        self.closed = True
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    peer.close_link(link)
        self.ops.fail_all(CommClosed("communicator closed while the operation was running"))

    def close_io(self) -> None:
        if self.beacon is not None:
            self.beacon.close()
        self.io.close()
        self.recovery_signal.close()

    def _drain(self, deadline: float) -> None:
        def pending() -> bool:
            return any(p.undelivered() and p.lost is None and (p.active or p.relay) for p in self.peers.values())
        for peer in self.peers.values():
            peer.ack_at_once()
        while pending() and self.clock.now() < deadline:
            self.progress_once(0.01)

    def _goodbye(self, deadline: float) -> None:
        links = []
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    link.queue_control(BYE, peer.inbound.cumulative_ack, arg=peer.outbound.last_seq,
                                       rails=self.rail_word.word)
                    links.append(link)
        for link in links:
            try:
                while not link.flush():
                    if self.clock.now() > deadline:
                        break
                    select.select([], [link.fd], [], 0.01)
                link.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        # Read (and drop) until the peer's EOF, so closing sends a FIN, not a RST.
        for link in links:
            try:
                link.sock.setblocking(False)
                while self.clock.now() < deadline:
                    r, _, _ = select.select([link.fd], [], [], max(0.0, deadline - self.clock.now()))
                    if not r:
                        break
                    if not link.sock.recv(1 << 16):
                        break
            except OSError:
                pass


__all__ = ["Engine", "TICK", "TICK_IDLE", "WATCH_DEGRADED"]
