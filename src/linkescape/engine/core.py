"""The progress engine: a small loop over peers, descriptors and timers.

- Each peer (``PeerChannel``) owns its links and data path; the engine polls
  their sockets and hands each event to the peer that owns the link.
- Operations in flight live in an ``OpTable``; verdicts on peers without a
  path in ``Liveness``; who drives progress (a waiting caller or the
  background thread) in the ``Driver``.
- Every socket is non-blocking and every state change happens under
  ``self.lock``.
- Nothing here runs per peer or per link on a clock: the timers look only
  at the *hot* peers (an operation pending with them, bytes of ours waiting
  for their kernel's ack, a fault being handled, a rail in hold-down), and
  wake the loop only while one is hot or when the probe budget is due.
  Idle and backup links are checked a fixed number a second per rank
  (``ProbeBudget``), whatever the number of peers.
"""

from __future__ import annotations

import collections
import logging
import select
import time
from typing import Callable, Dict, List, Optional

from ..config import Config
from ..errors import CommClosed
from ..protocol.frames import Kind
from ..protocol.linkstate import Ev, PathPolicy
from ..protocol.grey import RailRate, Window
from ..protocol.linkstate import State
from ..transport.tcp import ack_silence, tcp_sample
from ..protocol.railstate import RailWord
from .completion import OpTable
from .driver import Driver
from .io import IoSet
from .link import Link
from .liveness import Liveness
from .messages import ANY_SOURCE, Op
from .peer import PeerChannel
from .probes import ProbeBudget

log = logging.getLogger("linkescape.engine")

#: seconds between two goodput samples of the links (grey failure)
GREY_INTERVAL = 0.1
#: timer cadence while a fault is handled with some hot peer (no path, EOF,
#: a rail held out, parked or stashed frames)
TICK = 0.01
#: the longest the timers sleep while some peer is hot and healthy: owed
#: acks go out then (need_ack operations ask for theirs at once); silence
#: checks and heartbeats are scheduled for when they are due
TICK_IDLE = 0.04
#: peers with a rail down whose remaining links carry heartbeats (the rest: the probe budget)
WATCH_DEGRADED = 8


class Engine:
    def __init__(self, rank: int, world_size: int, nrails: int, config: Config, events=None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.nrails = nrails
        self.config = config
        self.events = events
        self.io = IoSet()
        self.driver = Driver(self)
        self.lock = self.driver.lock
        self.policy = PathPolicy(primary=0, holddown=config.failback_holddown, stripe=config.policy == "stripe")
        self.peers: Dict[int, PeerChannel] = {p: PeerChannel(self, p, nrails)
                                              for p in range(world_size) if p != rank}
        self.ops = OpTable(self)
        #: any-source receives not matched yet, by tag, in posting order
        self.any_recvs: Dict[int, "collections.deque"] = {}
        self.liveness = Liveness(self)
        #: sequence number of the last collective started here
        self.coll_started = 0
        self.fatal: Optional[BaseException] = None
        self.closed = False
        self.scratch = memoryview(bytearray(1 << 16))
        #: links cut by an emulated fault: unused, closed when the rail returns
        self.severed: List[Link] = []
        #: bytes a link may have queued before the sender stops carving frames
        self.watermark = 2 * config.chunk_bytes
        #: our rails without carrier; every frame carries the word (level state)
        self.rails = RailWord()
        #: healthy goodput per rail (grey-failure reference), shared by its links
        self.rail_rates = [RailRate() for _ in range(nrails)]
        #: peers the timers look at (see ``PeerChannel.quiet``); every other peer costs nothing
        self.hot: set = set()
        #: links that are down, as (peer, rail): what Recovery re-dials, without a scan of all peers
        self.down: set = set()
        #: peers that lost a rail and whose remaining links are watched closely
        #: (heartbeats): a second fault on them is the one that leaves no path.
        #: At most WATCH_DEGRADED, so a NIC failure facing N peers costs O(1).
        self.degraded_watch: set = set()
        #: idle and backup links are checked this many a second per rank, whatever N
        self.probes = ProbeBudget(sorted(self.peers), nrails, config.probe_rate)
        #: the link probed last: (peer, link), its acknowledgement looked at with the next probe
        self._probed = None
        self.next_timer = 0.0
        self._next_grey = 0.0
        #: called when a down link should be re-dialed now (set by Recovery)
        self.on_redial: Optional[Callable[[], None]] = None

    # ------------------------------------------------------------ driving (see Driver)
    def _acquire(self) -> None:
        self.driver.acquire()

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.driver.call_soon(fn)

    def start(self, op: Op) -> None:
        self.driver.start(op)

    def run(self, op: Op, posted=None) -> None:
        self.driver.run(op, posted)

    def wait(self, op: Op, timeout: Optional[float] = None) -> bool:
        return self.driver.wait(op, timeout)

    def start_background(self) -> None:
        self.driver.start_background()

    def wake(self) -> None:
        self.io.wake()

    @property
    def spin(self) -> float:
        return self.driver.spin

    @spin.setter
    def spin(self, value: float) -> None:
        self.driver.spin = value

    # ------------------------------------------------------------ links and descriptors
    def add_link(self, link: Link) -> None:
        """A link opened at start-up."""
        with self.lock:
            self.peers[link.peer].attach(link, time.monotonic())
        self.wake()

    def adopt_link(self, link: Link, peer_expected: int) -> None:
        self.peers[link.peer].adopt(link, peer_expected)

    def link_down(self, link: Link, ev: Ev, detail: str = "", close: bool = True) -> None:
        self.peers[link.peer].link_down(link, ev, detail=detail, close=close)

    def notify_peers(self, kind: int, rail: int) -> None:
        """Tell the peers that have a link on ``rail`` (or had one: NOTIFY_UP),
        over any surviving link, about our NIC on ``rail``."""
        down = kind == Kind.NOTIFY_DOWN
        for peer in self.peers.values():
            if (peer.links[rail] is not None) if down else (peer.status[rail].state is State.DOWN):
                peer.notify(kind, rail)

    def touch(self, peer: PeerChannel) -> None:
        """``peer`` needs the timers (traffic, a state change)."""
        self.hot.add(peer)

    def rail_lost(self, peer: PeerChannel) -> None:
        """``peer`` lost a link: watch its remaining ones closely, while fewer
        than WATCH_DEGRADED peers are (``PeerChannel._whole_again`` ends it)."""
        if len(self.degraded_watch) < WATCH_DEGRADED:
            self.degraded_watch.add(peer)

    def probe_failed(self, peer_rank: int, rail: int, refused: bool) -> None:
        self.liveness.probe_failed(self.peers[peer_rank], rail, refused)

    @property
    def rails_word(self) -> int:
        return self.rails.word

    def set_rail_state(self, rail: int, down: bool) -> None:
        """Record our NIC on ``rail`` as down or up in the word every frame carries."""
        self.rails.set(rail, down)

    def redial(self) -> None:
        if self.on_redial is not None:
            self.on_redial()

    def add_fd(self, fd: int, handler: Callable[[int], None]) -> None:
        """Watch another descriptor (carrier monitor) from both loops."""
        with self.lock:
            self.io.add_fd(fd, handler)
        self.wake()

    def remove_fd(self, fd: int) -> None:
        with self.lock:
            self.io.remove_fd(fd)

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
        now = time.monotonic()
        frames_sent = frames_received = 0
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    frames_sent += link.frames_sent
                    frames_received += link.frames_received
        return {"rank": self.rank, "world_size": self.world_size, "rails": self.nrails,
                "ops_pending": len(self.ops), "hot_peers": len(self.hot),
                "wakeups": self.io.wakeups, "frames_sent": frames_sent, "frames_received": frames_received,
                "peers": {rank: peer.snapshot(now) for rank, peer in self.peers.items()}}

    # ------------------------------------------------------------ services for peers
    def emit(self, event: str, peer: int, rail: int, cause: Optional[str], **extra) -> None:
        if self.events is not None:
            try:
                self.events.emit(event, peer=peer, rail=rail, cause=cause, **extra)
            except Exception:  # noqa: BLE001 - the event trail must never break the data path
                log.exception("event %s could not be recorded", event)
        else:
            log.info("%s peer=%s rail=%s cause=%s %s", event, peer, rail, cause, extra)

    def discard(self, n: int) -> memoryview:
        """A buffer for payload bytes nobody needs (duplicates)."""
        if len(self.scratch) < n:
            self.scratch = memoryview(bytearray(n))
        return self.scratch[:n]

    def protect_range(self, view: memoryview) -> None:
        """Before caller memory is overwritten, turn zero-copy frames that
        point into it into copies, so a replay sends the original bytes."""
        from ..protocol.channel import address_range

        lo = None
        for peer in tuple(self.hot):  # a peer with zero-copy frames unacknowledged is hot
            if peer.send.zc:
                if lo is None:
                    if not len(view):
                        return
                    lo, hi = address_range(view)
                peer.send.materialize(lo, hi)

    def set_fatal(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("communicator failed: %s", exc)
        self.ops.fail_all(exc)

    # ------------------------------------------------------------ operations
    def start_locked(self, op: Op) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.closed:
            raise CommClosed("communicator is closed")
        peers = self.peers
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
                raise peer.lost
            op.peers.add(m.peer)
        for m in op.sends:
            peers[m.peer].tx.post(m)
        for m in op.recvs:
            if m.peer == ANY_SOURCE:
                self._post_any(m)
            else:
                peers[m.peer].rx.post(m)
        self.ops.add(op)
        if op.collective:
            self.coll_started = op.seq
        hot = self.hot
        for p in op.peers:
            hot.add(peers[p])
            peers[p].resume_parked()
        for p in op.peers:
            peers[p].tx.pump()
        self.ops.check(op, time.monotonic())

    def _post_any(self, m) -> None:
        # a whole message that waits already (the earliest of any peer's) is taken at once
        for peer in self.peers.values():
            if peer.rx.take_any(m):
                return
        self.any_recvs.setdefault(m.msg, collections.deque()).append(m)

    def async_work(self) -> bool:
        """(any thread, without the lock: the driver asks) Work for the
        background thread. A copy of the hot set: it changes under the lock."""
        return bool(self.ops) or any(p.tx.busy for p in tuple(self.hot))

    # ------------------------------------------------------------ one round
    def progress_once(self, timeout: float) -> None:
        """One round: poll, read, write, timers. Caller holds the lock."""
        io = self.io
        events = io.poll(timeout)
        if self.driver.pending_soon:
            self.driver.run_soon()
        links = io.links
        hot = self.hot
        for fd, ev in events:
            link = links.get(fd)
            if link is None:
                if io.is_wake(fd):
                    io.drain_wake()
                elif fd in io.extra:
                    io.extra[fd](ev)
                continue
            peer = self.peers[link.peer]
            hot.add(peer)
            peer.on_event(link, ev)
        now = time.monotonic()
        if hot:
            for peer in list(hot):
                tx = peer.tx
                if tx.queue or tx.replay:
                    tx.pump()
                if tx.ack_urgent and peer.recv.ack_owed:
                    tx.send_ack()
        if self.ops:
            self.ops.check_all(now)
        if now >= self.next_timer:
            self._timers(now)
        elif hot and self.next_timer - now > TICK_IDLE:
            self.next_timer = now + TICK_IDLE

    def _timers(self, now: float) -> None:
        # If this rank ran later than its timers were due by more than the
        # silent timeout (descheduled, stopped, a long GIL hold), nothing was
        # observed meanwhile: start watching afresh. (Shorter gaps are the
        # normal life of a rank on a loaded host; treating them as blindness
        # would mean never finding a silent link there.)
        blind = now - self.next_timer > self.config.silent_timeout
        hot = self.hot
        soon = now + TICK_IDLE
        for peer in list(hot):
            soon = peer.tick(now, blind, soon)
            if peer.handling():
                soon = min(soon, now + TICK)
            if peer.no_path_since is not None:
                self.liveness.check(peer, now)
            else:
                peer.failback(now)
            if peer.recv.ack_owed:
                peer.tx.send_ack()
        if hot and now >= self._next_grey:
            self._next_grey = now + GREY_INTERVAL
            self._grey(now)
        due = self.probes.due(now)
        if due is not None:
            self._probe(due, now)
        for peer in [p for p in hot if p.quiet(now)]:
            hot.discard(peer)
        self.next_timer = max(soon, now + 0.001) if hot else self.probes.next_at

    def _probe(self, due, now: float) -> None:
        """The probe budget is due: look at the last probe's acknowledgement
        (a link still silent makes its peer hot: the silence check takes it
        from there), then probe the next link. A probed peer is not made hot,
        so a probe costs one wake-up here (and two at the peer: the frame,
        then the timer round that finds it quiet)."""
        last, self._probed = self._probed, None
        if last is not None:
            peer, link = last
            if peer.links[link.rail] is link and link.pending_since is not None and peer not in self.hot:
                try:
                    silent = ack_silence(link.sock)
                except OSError:
                    silent = 0.0
                if silent is None:
                    link.pending_since = None
                else:
                    self.hot.add(peer)
        peer = self.peers[due[0]]
        if peer not in self.hot and peer.probe(due[1], now):
            self._probed = (peer, peer.links[due[1]])

    def _grey(self, now: float) -> None:
        """Grey failure, per rail: every busy link's goodput window, judged
        against its rail's reference and its rail's total (so a link that
        only shares a healthy NIC is not grey); held links' cleanliness."""
        windows: Dict[int, list] = {}
        judged = []
        for peer in tuple(self.hot):  # a link that carried bytes belongs to a hot peer
            for link in peer.links:
                if link is None or link.status.state is not State.UP or link.grey is None:
                    continue
                try:
                    sample = tcp_sample(link.sock, now)
                except OSError:
                    continue
                w = link.grey.measure(sample)
                if peer.avoid >> link.rail & 1:
                    peer.hold_sample(link, now, sample.retrans_segs)
                elif w is not None:
                    windows.setdefault(link.rail, []).append(w)
                    judged.append((peer, link, w))
        for rail, ws in windows.items():
            self.rail_rates[rail].observe(Window.total(ws))
        for peer, link, w in judged:
            if (peer.links[link.rail] is link and link.grey.judge(w, now)
                    and peer.other_clean_rail(link.rail)):
                peer.degraded(link)

    # ------------------------------------------------------------ closing
    def close(self, graceful: bool = True, drain: float = 10.0) -> None:
        """Graceful: deliver everything still unacknowledged, say BYE on every
        link, half-close and wait for the peer's EOF, so no RST can destroy
        bytes the peer has not read yet."""
        self._acquire()
        try:
            if self.closed:
                return
            if graceful and self.fatal is None:
                self._drain(time.monotonic() + drain)
                self._goodbye(time.monotonic() + 2.0)
            self.closed = True
            for peer in self.peers.values():
                for link in peer.links:
                    if link is not None:
                        peer.drop(link)
            for link in self.severed:
                link.close()
            self.ops.fail_all(CommClosed("communicator closed while the operation was running"))
        finally:
            self.lock.release()
        self.driver.stop()
        self.io.close()

    def _drain(self, deadline: float) -> None:
        def pending() -> bool:
            return any((p.tx.queue or p.send.unacked) and p.lost is None and p.active for p in self.peers.values())
        for peer in self.peers.values():
            peer.tx.ack_urgent = True
        while pending() and time.monotonic() < deadline:
            self.progress_once(0.01)

    def _goodbye(self, deadline: float) -> None:
        import socket as _socket

        links = []
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    link.queue_control(Kind.BYE, peer.recv.cumulative_ack, arg=peer.send.last_seq,
                                       rails=self.rails_word)
                    links.append(link)
        for link in links:
            try:
                while not link.flush():
                    if time.monotonic() > deadline:
                        break
                    select.select([], [link.fd], [], 0.01)
                link.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        # Read (and drop) until the peer's EOF, so closing sends a FIN, not a RST.
        for link in links:
            try:
                link.sock.setblocking(False)
                while time.monotonic() < deadline:
                    r, _, _ = select.select([link.fd], [], [], max(0.0, deadline - time.monotonic()))
                    if not r:
                        break
                    if not link.sock.recv(1 << 16):
                        break
            except OSError:
                pass
