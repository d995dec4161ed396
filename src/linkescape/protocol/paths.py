"""A peer's paths, sans I/O: the escape policy of one pair, seen from one end.

``PeerPaths`` owns what decides where a peer's traffic goes: the state of the
link on each rail (``linkstate.LinkStatus``), the holds of rails found silent or
degraded (``grey.Hold``) and the rails held out by either end (the avoid masks),
the peer's rail word (``railstate.PeerRails``), the rails that carry now
(``active``), the relay route while no rail is left, the no-path and
end-of-file times, and which link epochs were dropped. Events go in as method
calls (a link opened or failed, the peer's rail word, a control frame's
notice, a hold's sample, a relay started, confirmed or lost, a dial that
failed, ``failback(now)``); what the I/O shell (``engine/peer.py``) must do
comes out as actions, taken with ``take()``:

- ``Emit(event, rail, cause, extra)``: an event for the operators;
- ``Fail(rail, ev, detail)``: take the link on ``rail`` down (its shell calls
  ``failed`` back when it does);
- ``Control(rail, kind, arg)``: a control frame on the link of ``rail``;
- ``REPLAY``: send every unacknowledged frame again on the new path;
- ``NO_PATH`` / ``PATH_BACK``: the pair lost its last path / has one again;
- ``RelayEnded(route, why)``: the relay route ended (the engine frees it);
- ``REDIAL``: a link to re-dial is due now (Recovery wakes);
- ``RELAY_BEAT``: a heartbeat through the relay (each side sends one every
  heartbeat interval: its silence and its ack are what the other side's
  relay timers judge);
- ``Resend(waited, frames)``: the peer's ack stood still through the relay
  while it spoke: everything unacknowledged goes again (``REPLAY`` follows).

The relay's timers are decided here too (``relay_tick``): its heartbeats,
its silence (``RELAY_SILENT``: the route is lost) and the resending of
frames lost at the relay (``RELAY_RTO``, doubling to ``RELAY_SILENT``).

No sockets, no threads, no clock reads: time is passed in. It imports nothing
from ``engine/`` or ``transport/``. The relay route is the shell's object; this
reads its ``via`` and writes its ``confirmed``, nothing else.

Costs: every call is O(R) for R rails of the pair (at most 16), none depends
on N; nothing here runs unless an event or the shell's timer asks.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional

from .frames import NOTIFY_DOWN, NOTIFY_SILENT, NOTIFY_STALE, NOTIFY_UP
from .grey import Hold
from .linkstate import Ev, LinkStatus, PathPolicy, State
from .railstate import PeerRails

CAUSE = {ev: ev.value for ev in (Ev.CARRIER_DOWN, Ev.PEER_CARRIER_DOWN, Ev.SOCKET_ERROR, Ev.TIMEOUT,
                                 Ev.PROTOCOL_ERROR, Ev.DEGRADED)}
#: a held rail's link beats this many times a heartbeat interval: the hold's evidence (grey.Hold)
HELD_BEATS = 4
#: while the rank is calm (no link of its own went down for ``CALM_AFTER`` seconds, no fault with
#: the peer), a busy pair's backups beat this often, not every heartbeat interval (``beat_every``)
CALM_BEAT = 1.0
CALM_AFTER = 30.0
#: a NOTIFY_STALE's arg: the rail (low 8 bits) and the epoch (above; at most 2**24 - 1)
STALE_RAIL_BITS = 8
#: bits of a HEARTBEAT's arg: the rails the sender holds out (low 8), the pairs it relays (above)
AVOID_MASK = 0xFF
LOAD_SHIFT = 8


class Emit(NamedTuple):
    event: str
    rail: int
    cause: Optional[str]
    extra: Dict[str, Any]


class Fail(NamedTuple):
    rail: int
    ev: Ev
    detail: str


class Control(NamedTuple):
    rail: int
    kind: int
    arg: int


class RelayEnded(NamedTuple):
    route: Any
    why: str


class _Signal(NamedTuple):
    name: str


class Resend(NamedTuple):
    waited: float
    frames: int


REPLAY = _Signal("replay")
NO_PATH = _Signal("no_path")
PATH_BACK = _Signal("path_back")
REDIAL = _Signal("redial")
RELAY_BEAT = _Signal("relay_beat")

#: a relayed peer we heard nothing from (its relayed heartbeats) for this long: the relay is broken
RELAY_SILENT = 1.0
#: a relayed pair whose peer acknowledged nothing new for this long, while frames of ours wait for
#: acknowledgement and none is left in our sockets, sends them all again (the wait doubling, up to
#: RELAY_SILENT): a frame lost at the relay (a link of it that failed, a notice of that which was
#: lost too) is found from the peer's cumulative ack, level state that every relayed heartbeat repeats
RELAY_RTO = 0.2


class RelayClock:
    """The relay route's timers (one per route started): when the peer was last heard through
    it, when we last beat through it, and the resend timer (the peer's ack as last seen, since
    when it has not moved, the current timeout, how many times everything was sent again)."""

    __slots__ = ("heard", "beat_at", "acked", "progress_at", "rto", "resent")

    def __init__(self, now: float) -> None:
        self.heard = now
        self.beat_at = now
        self.acked = 0
        self.progress_at = now
        self.rto = RELAY_RTO
        self.resent = 0


def judge_silence(now: float, silent: Optional[float], blind: bool, pending_since: Optional[float],
                  last_sent: float, writing: bool, timeout: float, heartbeat: float) -> tuple:
    """Silent loss on a link: our bytes (data or a heartbeat) wait for the peer's kernel to
    acknowledge them for longer than ``timeout``. Kernel acks keep coming while the peer process
    is busy, so only the path can trip this. ``silent``: how long the kernel has waited for an
    ack (None: nothing waits); silence counts from when bytes were first seen waiting
    (``pending_since``), not from the last ack: after a pause the last ack is old although the
    byte just went out. ``blind``: the clock jumped (a stall of our own): no verdict, start again.

    Returns (silent now, a follow-up frame to send first, pending_since, when to look again).
    Nothing sent behind the waiting bytes for half an interval (``last_sent``; ``writing``: bytes
    still queued) when the timeout passed: a lone lost segment waits ~250 ms for the kernel's
    retransmission, so one more frame goes first, whose duplicate ack comes at once on a live
    path (the verdict waits an interval for it)."""
    if silent is None or blind:
        return False, False, (None if silent is None else now), now + timeout
    if pending_since is None:
        pending_since = now
    quiet_for = min(silent, now - pending_since)
    if quiet_for > timeout and last_sent - pending_since < heartbeat / 2 and not writing:
        return False, True, pending_since, now + heartbeat
    # the earliest this silence can pass the timeout: look again then
    return quiet_for > timeout, False, pending_since, now + max(timeout - quiet_for, 0.001)


class PeerPaths:
    """One peer's paths, from this rank (``me``) to ``peer``."""

    def __init__(self, me: int, peer: int, nrails: int, policy: PathPolicy, holddown: float = 1.0,
                 reconnect_max: float = 0.5, stranded_backoff: float = 0.1) -> None:
        self.me = me
        self.peer = peer
        self.policy = policy
        self.reconnect_max = reconnect_max
        self.stranded_backoff = stranded_backoff
        self.status: List[LinkStatus] = [LinkStatus(rail=r) for r in range(nrails)]
        self.holds: List[Hold] = [Hold(base=holddown) for _ in range(nrails)]
        #: rails that carry our traffic now, best first (empty: no rail)
        self.active: List[int] = []
        #: the relay route while no rail is left (the shell's object: ``via``, ``confirmed``)
        self.relay: Any = None
        #: the timers of the relay route (of the last one started)
        self.relay_clock = RelayClock(0.0)
        self.no_path_since: Optional[float] = None
        #: when every link ended with FIN/RST (a dead process, or a peer re-dialing)
        self.eof_since: Optional[float] = None
        #: rails held out of service (degraded, silent) by us, and by the peer (its heartbeats)
        self.avoid = 0
        self.peer_avoid = 0
        self.peer_rails = PeerRails()
        #: the epoch of the link in service per rail (0: none)
        self.epochs: List[int] = [0] * nrails
        #: (we are the lower rank: the peer dials) per rail, the epoch of the last link we dropped
        self.dropped_epoch: List[int] = [0] * nrails
        self._out: list = []

    # ------------------------------------------------------------ actions
    def take(self) -> list:
        """The actions since the last call, in order."""
        out, self._out = self._out, []
        return out

    def _emit(self, event: str, rail: int, cause: Optional[str], **extra) -> None:
        self._out.append(Emit(event, rail, cause, extra))

    # ------------------------------------------------------------ views
    def up(self, rail: int) -> bool:
        return self.status[rail].state is State.UP

    def live_rails(self) -> List[int]:
        return [st.rail for st in self.status if st.state is State.UP]

    @property
    def whole(self) -> bool:
        return all(st.state is State.UP for st in self.status)

    def held(self) -> int:
        return self.avoid | self.peer_avoid

    def faulted(self) -> bool:
        """No path, a relay, EOF, a rail held out (by either end)."""
        return bool(self.no_path_since is not None or self.relay is not None or self.eof_since is not None
                    or self.avoid or self.peer_avoid)

    def settled(self, now: float) -> bool:
        """No fault, no rail in hold-down, the path the policy would choose."""
        if self.faulted():
            return False
        policy = self.policy
        for st in self.status:
            if st.state is State.UP and not policy.eligible(st, now):
                return False
        return policy.choose(self.status, now, 0) == self.active

    def other_clean_rail(self, rail: int) -> bool:
        held = self.held()
        return any(st.rail != rail and st.state is State.UP and not held >> st.rail & 1 for st in self.status)

    def beat_every(self, rail: int, engaged: bool, heartbeat: float, calm: bool = False) -> Optional[float]:
        """How often the link on ``rail`` beats: a rail we hold out ``HELD_BEATS`` times a
        heartbeat interval (its cleanliness is judged from them: ``grey.Hold``), any other every
        interval while the pair is ``engaged`` (an operation's traffic pending, or watched
        closely); None: it does not beat (an idle link is looked at by the probe budget only).

        ``calm`` (the rank saw no fault of its own for ``CALM_AFTER`` seconds, none is handled with
        the peer, it is not watched): a backup (a rail not carrying the traffic) beats every
        ``CALM_BEAT`` instead. A fault makes every busy pair's backups beat every interval again
        from the next timer round on: faults come together (a switch, a cable tray), and the
        backup the next failover takes must be known good then."""
        if self.avoid >> rail & 1:
            return heartbeat / HELD_BEATS
        if not engaged:
            return None
        if calm and rail not in self.active:
            return max(heartbeat, CALM_BEAT)
        return heartbeat

    def beat_arg(self, relaying: int) -> int:
        return (self.avoid & AVOID_MASK) | (min(relaying, 0xFFFF) << LOAD_SHIFT)

    def redial_due(self, rail: int) -> Optional[tuple]:
        """(next try, never up yet) of the link on ``rail`` while it is down; None otherwise."""
        st = self.status[rail]
        if st.state is not State.DOWN:
            return None
        return st.next_probe, st.never_up

    # ------------------------------------------------------------ links
    def await_first(self, rail: int, now: float) -> None:
        """A link not opened at start-up (a backup): down, to be dialed at once."""
        self.status[rail].await_first(now)

    def opened(self, rail: int, epoch: int, now: float, reopened: bool) -> None:
        """A link on ``rail`` is in service: one opened at start-up or by an emulated repair, or
        re-opened by either side (``reopened``)."""
        status = self.status[rail]
        cause = status.down_cause
        first = status.never_up  # its first connection (a backup opened after start-up): no event
        status.apply(Ev.CONNECTED, now)
        self.epochs[rail] = epoch
        self.holds[rail].new_link(now)
        if reopened:
            self.eof_since = None
        if reopened and not first:
            self._emit("link_up", rail, CAUSE.get(cause), epoch=epoch)
            self.reroute(now, cause=CAUSE.get(cause))
        else:
            self.reroute(now, opened=rail if first else None)

    def failed(self, rail: int, ev: Ev, now: float, detail: str = "") -> None:
        """The link on ``rail`` failed (the shell has dropped it): its traffic moves (replay)."""
        was_active = rail in self.active
        if ev in (Ev.TIMEOUT, Ev.DEGRADED):
            # back only once clean: a lossy rail must not flap
            self.holds[rail].trip(now)
            self.avoid |= 1 << rail
        self.status[rail].apply(ev, now, backoff_max=self.reconnect_max)
        if self.me < self.peer:
            # (the peer hears of it now, if a link is left, from NOTIFY_SILENT/NOTIFY_DOWN, its carrier,
            # or our FIN: each with its cause; ``tell_stale`` repeats it from the next link up)
            self.dropped_epoch[rail] = self.epochs[rail]
        self.epochs[rail] = 0
        self._emit("link_down", rail, CAUSE[ev], detail=detail)
        self._out.append(REPLAY)
        self.reroute(now, cause=CAUSE[ev], moved_from=rail if was_active else None)
        self._out.append(REDIAL)  # Recovery sleeps until a link is down

    def ended(self, now: float) -> None:
        """Every link ended with FIN/RST. A dead process also lost its listener: the dialing side
        learns that at once (refused on every rail); the accepting side waits briefly for a re-dial,
        which a live peer that merely dropped a link it believed dead would make."""
        if self.eof_since is not None:
            return
        self.eof_since = now
        if self.me > self.peer:
            for st in self.status:
                if st.state is State.DOWN:
                    st.next_probe = now
            self._out.append(REDIAL)

    def dial_failed(self, rail: int, now: float, stranded: bool) -> None:
        """A re-dial of ours failed: back off (at the stranded pace while no path is left)."""
        st = self.status[rail]
        if st.state is State.DOWN:
            st.apply(Ev.PROBE, now)
            cap = min(self.reconnect_max, self.stranded_backoff) if stranded else self.reconnect_max
            st.apply(Ev.PROBE_FAILED, now, backoff_min=0.05, backoff_max=cap)

    def retry_now(self, rail: int, now: float) -> bool:
        """Dial the link on ``rail`` again now, if it is down (a rail back, a notice)."""
        st = self.status[rail]
        if st.state is not State.DOWN:
            return False
        st.next_probe = now
        st.backoff = 0.0
        self._out.append(REDIAL)
        return True

    def redial_now(self, now: float) -> None:
        """The last rail is gone: the links we re-dial (we are the higher rank) that are down
        are dialed again now, not when a back-off grown during an earlier outage ends."""
        if self.me > self.peer:
            for rail in range(len(self.status)):
                self.retry_now(rail, now)

    # ------------------------------------------------------------ the route
    def reroute(self, now: float, cause: Optional[str] = None, moved_from: Optional[int] = None,
                opened: Optional[int] = None, held_out: int = 0) -> None:
        """Choose the rails that carry (or keep the relay). ``moved_from``: the active rail whose
        link just went down; ``held_out``: rails the peer just held out (grey) while their links
        stay up: leaving one is a failover too."""
        policy = self.policy
        old = self.active
        new = policy.choose(self.status, now, self.held())
        if self.relay is not None:
            if new and (not self.relay.confirmed or any(policy.eligible(self.status[r], now) for r in new)):
                self._relay_off("path_back")  # a rail is back (and past its hold-down, if the relay works)
            else:
                self.active = []
                return  # the relay carries the traffic until then
        self.active = new
        if not new:
            if self.no_path_since is None:
                self.no_path_since = now
                self._emit("no_path", moved_from if moved_from is not None else -1, cause or "socket_error",
                           since=None)
                self._out.append(NO_PATH)
                self.redial_now(now)
            return
        if self.no_path_since is not None:
            self.no_path_since = None
            self._out.append(REPLAY)
            self._out.append(PATH_BACK)
        if moved_from is not None:
            self._out.append(REPLAY)  # what was on the dead link is lost: resend all unacked
        if old and new != old:
            left = [r for r in old if r not in new and held_out >> r & 1]
            if moved_from is not None:
                self._emit("failover", new[0], cause or "socket_error", from_rail=moved_from)
            elif left:
                # the peer found the rail lossy or silent before we did: its link is still up
                # here, but traffic moved off it all the same
                self._emit("failover", new[0], cause or "degraded", from_rail=left[0])
            elif (new[0] == policy.primary or (policy.stripe and len(new) > len(old))) and any(
                    r != opened for r in new if r not in old):
                # (a rail whose first link just opened is not failed back to: a primary link
                # opened after start-up, once a backup came up first)
                self._emit("failback", new[0], None, from_rail=old[0])
        elif not old and moved_from is not None:
            self._emit("failover", new[0], cause or "socket_error", from_rail=moved_from)

    def failback(self, now: float) -> bool:
        """Move traffic back to a better rail (or from a relay to a rail) once it is eligible
        again; True when the route changed."""
        policy = self.policy
        held = self.held()
        if self.relay is not None:
            new = policy.choose(self.status, now, held)
            if new and (not self.relay.confirmed or any(policy.eligible(self.status[r], now) for r in new)):
                self.reroute(now)
                return True
        elif self.active and policy.choose(self.status, now, held) != self.active:
            self.reroute(now)
            return True
        return False

    # ------------------------------------------------------------ the relay
    def relay_started(self, route: Any, now: float) -> None:
        """No rail is left: our frames go through ``route`` (a third rank) from now on (the shell
        beats through it at once, after the replay: the peer confirms the route by answering)."""
        self.relay = route
        self.relay_clock = RelayClock(now)
        self.active = []
        self._out.append(REPLAY)

    def relay_heard(self, now: float) -> None:
        """A frame of the peer's came through a relay: the route works (``relay_on`` the first time)."""
        self.relay_clock.heard = now
        if self.relay is not None and not self.relay.confirmed:
            self.relay_confirmed()

    def relay_tick(self, now: float, heartbeat: float, acked: int, unacked: int, writing: bool,
                   due: float) -> float:
        """The relay's timers (while ``relay`` is set): the route lost after ``RELAY_SILENT``
        without a word of the peer's; a heartbeat through it every ``heartbeat`` seconds; everything
        unacknowledged sent again (``Resend``, ``REPLAY``) when the peer's ``acked`` stood still
        for the resend timeout while ``unacked`` frames of ours wait, none is being ``writing``
        into our sockets, and the peer spoke meanwhile (a peer that says nothing is starved or
        gone: sending again would only load the relay). Returns when they are next due (``due``
        if nothing is sooner)."""
        route, clock = self.relay, self.relay_clock
        if now - clock.heard > RELAY_SILENT:
            self.relay_lost(route.via, "timeout", now)
            return due
        if now - clock.beat_at >= heartbeat:
            self._out.append(RELAY_BEAT)
            clock.beat_at = now
        due = min(due, clock.beat_at + heartbeat, clock.heard + RELAY_SILENT)
        if not unacked or acked != clock.acked or writing:
            clock.acked = acked
            clock.progress_at = now
            clock.rto = RELAY_RTO
        elif now + 1e-9 >= clock.progress_at + clock.rto and clock.heard > clock.progress_at:
            # (a timer due then may wake a float hair early)
            self._out.append(Resend(now - clock.progress_at, unacked))
            self._out.append(REPLAY)
            clock.progress_at = now
            clock.rto = min(2 * clock.rto, RELAY_SILENT)
            clock.resent += 1
        if unacked:
            due = min(due, clock.progress_at + clock.rto)
        return due

    def relay_confirmed(self) -> None:
        """A frame of the peer's came back through a relay: the route works."""
        route = self.relay
        route.confirmed = True
        self._emit("relay_on", -1, None, via=route.via)
        if self.no_path_since is not None:
            self.no_path_since = None
            self._out.append(PATH_BACK)

    def relay_lost(self, via: int, why: str, now: float) -> bool:
        """The relay through ``via`` cannot carry our frames any more; True when it was ours."""
        route = self.relay
        if route is None or route.via != via:
            return False
        self._relay_off(why)
        self.reroute(now, cause=why)
        return True

    def _relay_off(self, why: str) -> None:
        route = self.relay
        self.relay = None
        self._out.append(REPLAY)
        if route.confirmed:
            self._emit("relay_off", -1, why, via=route.via, bytes=getattr(route, "bytes", 0))
        self._out.append(RelayEnded(route, why))

    # ------------------------------------------------------------ what the peer says
    def peer_word(self, word: int, now: float, local_down: int) -> None:
        """The peer's rails without carrier, as every frame of its repeats them."""
        down, up = self.peer_rails.apply(word)
        for rail in down:
            if rail < len(self.status) and self.up(rail):
                self._out.append(Fail(rail, Ev.PEER_CARRIER_DOWN, "peer NIC lost carrier"))
        for rail in up:
            if rail < len(self.status):
                self.retry_now(rail, now)
        if up:
            self.tell_stale(local_down)

    def peer_held(self, avoid: int, now: float) -> bool:
        """The rails the peer holds out, from its heartbeat's arg (the avoid bits; the load above them is
        the shell's); True when they changed."""
        avoid &= AVOID_MASK
        if avoid == self.peer_avoid:
            return False
        newly = avoid & ~self.peer_avoid
        self.peer_avoid = avoid
        self.reroute(now, held_out=newly)
        return True

    def notice(self, kind: int, arg: int, now: float) -> None:
        """A notice of the peer's about one of the pair's rails (a control frame)."""
        nrails = len(self.status)
        if kind == NOTIFY_DOWN:
            if arg < nrails and self.up(arg):
                self._out.append(Fail(arg, Ev.PEER_CARRIER_DOWN, "peer NIC lost carrier"))
        elif kind == NOTIFY_SILENT:
            if arg < nrails and self.up(arg):
                self._out.append(Fail(arg, Ev.TIMEOUT, "the peer found the link silent"))
        elif kind == NOTIFY_UP:
            if arg < nrails:
                self.retry_now(arg, now)
        elif kind == NOTIFY_STALE:
            rail, epoch = arg & ((1 << STALE_RAIL_BITS) - 1), arg >> STALE_RAIL_BITS
            if rail < nrails and self.up(rail) and self.epochs[rail] <= epoch:
                self._out.append(Fail(rail, Ev.SOCKET_ERROR, f"rank {self.peer} has no link on rail {rail} since "
                                                             f"epoch {epoch}: it closed its end while no frame "
                                                             f"could reach us"))

    def tell_stale(self, local_down: int) -> None:
        """Level state for the dialer of our links (we are the lower rank): on a rail where we have
        no link (we dropped epoch E) while our NIC and the peer's have carrier, the peer either
        re-dials already (it ignores this) or still holds epoch E, which is gone: we closed our end
        while no frame could reach it. Told over a live link whenever that can newly reach the peer
        or newly be true (a link comes up, a NIC is back); no timer, nothing periodic."""
        if self.me > self.peer:
            return
        live = self.live_rails()
        if not live:
            return
        for rail, st in enumerate(self.status):
            epoch = self.dropped_epoch[rail]
            if st.state is State.UP or not epoch or local_down >> rail & 1 or self.peer_rails.is_down(rail):
                continue
            carrier = next((r for r in live if r != rail), None)
            if carrier is not None:
                epoch = min(epoch, (1 << (32 - STALE_RAIL_BITS)) - 1)
                self._out.append(Control(carrier, NOTIFY_STALE, rail | epoch << STALE_RAIL_BITS))

    # ------------------------------------------------------------ holds (grey failure)
    def hold_sample(self, rail: int, now: float, retrans_segs: int, data_segs: int) -> bool:
        """A held rail's link carries heartbeats: True when it is clean again (and the route
        was looked at again)."""
        if not self.holds[rail].sample(now, retrans_segs, data_segs):
            return False
        self.avoid &= ~(1 << rail)
        self.failback(now)
        return True


__all__ = ["PeerPaths", "judge_silence", "Emit", "Fail", "Control", "RelayEnded", "Resend", "REPLAY", "NO_PATH", "PATH_BACK",
           "REDIAL", "RELAY_BEAT", "RelayClock", "RELAY_SILENT", "RELAY_RTO", "HELD_BEATS", "CALM_BEAT", "CALM_AFTER",
           "CAUSE", "STALE_RAIL_BITS", "AVOID_MASK", "LOAD_SHIFT"]
