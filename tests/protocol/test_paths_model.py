"""protocol/paths.PeerPaths checked by a model: the two ends of a pair, joined by a simulated
network of R rails, driven by hypothesis through random faults, repairs, flaps, lost notices and
clock steps. After every step the invariants of the escape hold:

1. no frame goes on a link known down (``active`` holds only rails whose link is UP);
2. a rail that failed carries traffic again only after its hold-down, unless no other rail is
   eligible (it is then the last resort, which is the policy), so a flapping rail cannot make the
   pair switch faster than the hold-down allows;
3. a pair with a rail that works uses a rail (or knows it has none) within the detection bound
   plus a re-dial (and the hold-down, while a relay that works carries it);
4. both ends agree on the pair's rails within a bounded time after the network last changed;
5. when every fault is repaired, the pair is back on its primary within that bound;
6. a relay carries alone and is a third rank (no loop); it never outlives ``RELAY_SILENT``
   without a word of the peer's through it, and is never lost to that silence while the third
   rank carries the pair's relayed heartbeats (``PeerPaths.relay_tick``).

The simulated network: each rank's NIC per rail has carrier or not; a rail may be black-holed
(packets vanish, carrier up). A rank learns its own carrier loss at once; the peer learns it from
the rail word of the next frame on a link that still works, or by silence after ``DETECT``. A
black hole is found by silence at both ends. A link one end dropped (it closed its socket) ends at
the other when the rail carries again (the FIN, or the RST its next frame draws). Control frames (notices, heartbeats) go over a link
that works at both ends, and may be lost. The higher rank dials the links that are down when
their back-off ends; a dial succeeds only over a working rail. A third rank may relay (it carries
each end's relayed heartbeats, which ``relay_tick`` asks for every ``HB``), refuse (RELAY_UNREACH:
the route ends at once), or take frames that then vanish (the route ends by its silence). The chaos schedules that found bugs
(``tests/chaos/schedules/``) are replayed here as seeds (``test_chaos_schedules_as_seeds``).
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from linkescape.protocol import paths as P
from linkescape.protocol.frames import NOTIFY_DOWN, NOTIFY_SILENT
from linkescape.protocol.linkstate import Ev, PathPolicy, State

RAILS = 3
HOLDDOWN = 1.0
DETECT = 0.2  # the silent timeout
RECONNECT_MAX = 0.5
TICK = 0.01
HB = 0.05  # the heartbeat interval (LINKESCAPE_HEARTBEAT_MS's default)
HERE = os.path.join(os.path.dirname(__file__), "..", "chaos", "schedules")


class Route:
    """A relay route through a third rank (the shell's RelayPath, as PeerPaths sees it)."""

    def __init__(self, via: int) -> None:
        self.via = via
        self.confirmed = False
        self.bytes = 0


class Pair:
    """Two PeerPaths and the network between them (time is this object's)."""

    def __init__(self, rails: int = RAILS, policy_cls=PathPolicy) -> None:
        self.rails = rails
        self.now = 0.0
        self.ends = [P.PeerPaths(me, 1 - me, rails, policy_cls(primary=0, holddown=HOLDDOWN),
                                 holddown=HOLDDOWN, reconnect_max=RECONNECT_MAX) for me in (0, 1)]
        self.carrier = [[True] * rails for _ in range(2)]
        self.black = [False] * rails
        self.epoch = [1] * rails
        #: (due, end, rail, ev) detections to come (silence, a peer's carrier heard late)
        self.pending = []
        self.lossy_control = False
        #: a third rank reaches both ends (a relay is possible)
        self.third = False
        #: ... but what goes through it vanishes (its link to one end black-holed, unknown to it)
        self.third_silent = False
        #: since when the third rank carries the relayed heartbeats (None: it does not)
        self.third_ok_since = None
        self.gen = [0, 0]
        #: each rank's rail word the last frames carried to the other
        self.carried = [0, 0]
        self.changed_at = 0.0
        self.segs = 0
        self.events = []
        for r in range(rails):
            for e in self.ends:
                e.opened(r, 1, self.now, reopened=False)
        self.drain()

    # ------------------------------------------------------------ the network
    def works(self, rail: int) -> bool:
        return self.carrier[0][rail] and self.carrier[1][rail] and not self.black[rail]

    def link_works(self, rail: int) -> bool:
        """A frame on ``rail`` gets through: the rail works and both ends have the link up."""
        return self.works(rail) and all(e.up(rail) for e in self.ends)

    def word(self, me: int) -> int:
        mask = sum(1 << r for r in range(self.rails) if not self.carrier[me][r])
        return (self.gen[me] << 8) | mask

    # ------------------------------------------------------------ actions of the ends
    def drain(self) -> None:
        """Carry out what the ends decided, until nothing is left."""
        for _ in range(1000):
            busy = False
            for me, end in enumerate(self.ends):
                for act in end.take():
                    busy = True
                    self.act(me, act)
            if not busy:
                return
        raise AssertionError("the ends keep deciding: a loop")

    def act(self, me: int, act) -> None:
        end = self.ends[me]
        if isinstance(act, P.Fail):
            if end.up(act.rail):
                end.failed(act.rail, act.ev, self.now, act.detail)
        elif isinstance(act, P.Control):
            other = self.ends[1 - me]
            if self.link_works(act.rail) and not self.lossy_control:
                other.notice(act.kind, act.arg, self.now)
        elif act is P.RELAY_BEAT:
            if self.carrying():
                self.ends[1 - me].relay_heard(self.now)
        elif isinstance(act, P.Emit):
            self.events.append((self.now, me, act.event, act.rail))
            if act.event == "relay_off" and act.cause == "timeout":
                ok = self.third_ok_since
                assert ok is None or self.now - ok < HB + 2 * TICK, ("relay lost to silence while the "
                                                                      "third rank carries", self.now, ok)

    def carrying(self) -> bool:
        return self.third and not self.third_silent

    def set_third(self, reach: bool, silent: bool) -> None:
        was = self.carrying()
        self.third, self.third_silent = reach, silent
        if self.carrying() != was:
            self.third_ok_since = self.now if self.carrying() else None
        self.changed_at = self.now

    def tell(self, me: int, kind: int, rail: int) -> None:
        """A notice of ``me`` about ``rail``, over another rail that works (the shell's _notify)."""
        via = [r for r in range(self.rails) if r != rail and self.link_works(r)]
        if via and not self.lossy_control:
            self.ends[1 - me].notice(kind, rail, self.now)

    def frames(self) -> None:
        """Frames flow on the links that work: each carries its sender's rail word and heartbeats
        its avoid mask (both level state: repeated)."""
        if not any(self.link_works(r) for r in range(self.rails)):
            return
        for me in (0, 1):
            other = self.ends[1 - me]
            self.carried[me] = self.gen[me]
            other.peer_word(self.word(me), self.now, self.local_down(1 - me))
            other.peer_held(self.ends[me].beat_arg(0), self.now)

    def local_down(self, me: int) -> int:
        return sum(1 << r for r in range(self.rails) if not self.carrier[me][r])

    # ------------------------------------------------------------ faults
    def set_carrier(self, me: int, rail: int, up: bool) -> None:
        if self.carrier[me][rail] == up:
            return
        self.carrier[me][rail] = up
        self.gen[me] = (self.gen[me] + 1) & 0xFF
        self.changed_at = self.now
        end = self.ends[me]
        if not up:
            if end.up(rail):
                end.failed(rail, Ev.CARRIER_DOWN, self.now, "carrier")
            self.tell(me, NOTIFY_DOWN, rail)
            # the peer hears it from the word on the next frame, or finds the link silent
            self.pending.append((self.now + DETECT, 1 - me, rail, Ev.TIMEOUT))
        else:
            end.retry_now(rail, self.now)
            end.tell_stale(self.local_down(me))
        self.drain()

    def set_black(self, rail: int, black: bool) -> None:
        if self.black[rail] == black:
            return
        self.black[rail] = black
        self.changed_at = self.now
        if black:
            for me in (0, 1):
                self.pending.append((self.now + DETECT, me, rail, Ev.TIMEOUT))

    # ------------------------------------------------------------ time
    def advance(self, dt: float) -> None:
        end_at = self.now + dt
        while self.now < end_at - 1e-9:
            self.now = min(end_at, self.now + TICK)
            self.step()

    def step(self) -> None:
        now = self.now
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _t, me, rail, ev in due:
            end = self.ends[me]
            # silence: only a link whose rail does not work stays silent (a repair in between: no verdict)
            if end.up(rail) and not self.works(rail):
                end.failed(rail, ev, now, "silent")
                self.tell(me, NOTIFY_SILENT, rail)
        self.drain()
        # a link one end dropped (it closed its socket) while the other kept it: the FIN (or the RST
        # its next frame draws) reaches the other end once the rail carries again
        for rail in range(self.rails):
            if self.works(rail):
                for me in (0, 1):
                    if self.ends[me].up(rail) and not self.ends[1 - me].up(rail):
                        self.ends[me].failed(rail, Ev.SOCKET_ERROR, now, "connection closed by the peer")
        self.drain()
        self.frames()
        self.drain()
        # the higher rank dials the links that are down when their back-off ends
        dialer, acceptor = self.ends[1], self.ends[0]
        for rail in range(self.rails):
            due_at = dialer.redial_due(rail)
            if due_at is None or due_at[0] > now:
                continue
            if self.works(rail):
                self.epoch[rail] += 1
                for end in (acceptor, dialer):
                    if end.up(rail):  # the other end re-dialed: the old connection is dead
                        end.failed(rail, Ev.SOCKET_ERROR, now, "replaced by a new connection")
                    end.opened(rail, self.epoch[rail], now, reopened=True)
            else:
                dialer.dial_failed(rail, now, dialer.no_path_since is not None and dialer.relay is None)
        self.drain()
        # no rail left: the engine tries a relay through the third rank, which confirms once a frame
        # of the peer's came back through it; a third rank that cannot reach them says so
        for me, end in enumerate(self.ends):
            if end.relay is None and end.no_path_since is not None and not end.active and self.third:
                end.relay_started(Route(via=2), now)
                self.act(me, P.RELAY_BEAT)  # (the shell beats through a new route at once)
            elif end.relay is not None and not self.third:
                end.relay_lost(end.relay.via, "unreachable", now)
        self.drain()
        # the relay's timers: its heartbeats, its silence (no data is modelled: nothing to resend)
        for end in self.ends:
            if end.relay is not None:
                end.relay_tick(now, HB, 0, 0, False, now + 1.0)
        self.drain()
        # held rails' links beat; their TCP counters say whether they are clean
        self.segs += 10
        for end in self.ends:
            for rail in range(self.rails):
                if end.avoid >> rail & 1 and end.up(rail):
                    end.hold_sample(rail, now, 0 if self.works(rail) else self.segs, self.segs)
            end.failback(now)
        self.drain()

    # ------------------------------------------------------------ bounds
    def settle_bound(self) -> float:
        """How long after the network last changed both ends must agree: a detection, a re-dial
        (its back-off), the hold-down, and the longest hold of a rail held out, with their ticks."""
        hold = max(h.length for e in self.ends for h in e.holds)
        return DETECT + 2 * RECONNECT_MAX + HOLDDOWN + hold + 0.2


class PairMachine(RuleBasedStateMachine):
    policy_cls = PathPolicy

    @initialize()
    def start(self):
        self.pair = Pair(policy_cls=self.policy_cls)

    @rule(me=st.integers(0, 1), rail=st.integers(0, RAILS - 1), notice_lost=st.booleans())
    def cut(self, me, rail, notice_lost):
        """A NIC loses carrier; its notice to the peer (NOTIFY_DOWN) may be lost with the frame."""
        p = self.pair
        lossy, p.lossy_control = p.lossy_control, p.lossy_control or notice_lost
        p.set_carrier(me, rail, False)
        p.lossy_control = lossy

    @rule(me=st.integers(0, 1), rail=st.integers(0, RAILS - 1))
    def repair(self, me, rail):
        self.pair.set_carrier(me, rail, True)

    @rule(rail=st.integers(0, RAILS - 1))
    def blackhole(self, rail):
        self.pair.set_black(rail, True)

    @rule(rail=st.integers(0, RAILS - 1))
    def unblackhole(self, rail):
        self.pair.set_black(rail, False)

    @rule(me=st.integers(0, 1), rail=st.integers(0, RAILS - 1), period=st.sampled_from([0.05, 0.2, 0.6]),
          cycles=st.integers(1, 4))
    def flap(self, me, rail, period, cycles):
        for _ in range(cycles):
            self.pair.set_carrier(me, rail, False)
            self.pair.advance(period / 2)
            self.pair.set_carrier(me, rail, True)
            self.pair.advance(period / 2)

    @rule(me=st.integers(0, 1), hold=st.sampled_from([0.1, 0.5, 2.5]), reach=st.booleans(),
          lossy=st.booleans())
    def host_cut_off(self, me, hold, reach, lossy):
        """Every rail of one end cut (a top-of-rack switch), a third rank able to relay or not,
        notices lost or not; then repaired."""
        p = self.pair
        p.set_third(reach, False)
        p.lossy_control = lossy
        for rail in range(RAILS):
            p.set_carrier(me, rail, False)
        p.advance(hold)
        for rail in range(RAILS):
            p.set_carrier(me, rail, True)

    @rule(reach=st.booleans(), silent=st.booleans())
    def third_rank(self, reach, silent):
        """A third rank that can relay or says it cannot; one that can may lose what it carries
        without knowing (the route ends by its silence)."""
        self.pair.set_third(reach, silent)

    @rule(lossy=st.booleans())
    def control_frames_lost(self, lossy):
        self.pair.lossy_control = lossy

    @rule(dt=st.sampled_from([0.01, 0.05, 0.15, 0.3, 0.7, 1.5]))
    def wait(self, dt):
        self.pair.advance(dt)

    @rule()
    def repair_everything(self):
        p = self.pair
        for rail in range(RAILS):
            p.set_black(rail, False)
            for me in (0, 1):
                p.set_carrier(me, rail, True)
        p.lossy_control = False

    @precondition(lambda self: hasattr(self, "pair"))
    @rule()
    def settle(self):
        """Wait out the bound, then check that the ends agree (and are on the primary when whole)."""
        p = self.pair
        p.lossy_control = False
        p.advance(p.settle_bound())
        a, b = p.ends
        assert a.active == b.active, (p.now, a.active, b.active, self._state())
        if all(p.works(r) for r in range(RAILS)):
            assert a.active == [0], (a.active, self._state())
        elif any(p.works(r) for r in range(RAILS)):
            assert a.active and all(p.works(r) for r in a.active), (a.active, self._state())
        elif p.carrying():
            assert all(e.relay is not None and e.relay.confirmed and e.no_path_since is None for e in p.ends), \
                ("relayed", self._state())
        else:
            assert not a.active and a.no_path_since is not None and b.no_path_since is not None, \
                ("no path, no relay", self._state())
        if any(p.works(r) for r in range(RAILS)):
            assert a.relay is None and b.relay is None, self._state()  # a rail is back: the relay ended

    def _state(self):
        p = self.pair
        return {"carrier": p.carrier, "black": p.black, "events": p.events[-12:],
                "status": [[(s.state.value, s.failures, s.up_since) for s in e.status] for e in p.ends],
                "avoid": [(e.avoid, e.peer_avoid) for e in p.ends],
                "relay": [(e.relay.via, e.relay.confirmed) if e.relay else None for e in p.ends], "third": p.third,
                "third_silent": p.third_silent}

    @invariant()
    def no_frame_on_a_link_known_down(self):
        if not hasattr(self, "pair"):
            return
        for e in self.pair.ends:
            for r in e.active:
                assert e.status[r].state is State.UP, (r, self._state())

    @invariant()
    def a_relay_carries_alone_and_never_loops(self):
        """While relayed, no rail carries (frames go one way); the relay is a third rank."""
        if not hasattr(self, "pair"):
            return
        for me, e in enumerate(self.pair.ends):
            if e.relay is not None:
                assert not e.active and e.relay.via not in (me, 1 - me), self._state()

    @invariant()
    def a_relay_never_outlives_its_silence(self):
        """A route that carried nothing of the peer's for RELAY_SILENT is given up (by the next tick)."""
        if not hasattr(self, "pair"):
            return
        for e in self.pair.ends:
            if e.relay is not None:
                assert self.pair.now - e.relay_clock.heard <= P.RELAY_SILENT + TICK + 1e-9, \
                    ("relay silent", self.pair.now, e.relay_clock.heard, self._state())

    @invariant()
    def no_frame_on_a_rail_the_peer_said_is_down(self):
        """Once a frame carried the peer's rail word, a rail it says lost carrier is left."""
        if not hasattr(self, "pair"):
            return
        p = self.pair
        for me, e in enumerate(p.ends):
            o = 1 - me
            if p.carried[o] != p.gen[o]:
                continue  # its last change has not been carried yet
            for r in e.active:
                assert p.carrier[o][r], (me, r, "known_down by the peer's word", self._state())

    @invariant()
    def a_repaired_rail_waits_its_hold_down(self):
        if not hasattr(self, "pair"):
            return
        now = self.pair.now
        for e in self.pair.ends:
            pol, held = e.policy, e.held()
            for r in e.active:
                st_ = e.status[r]
                if st_.failures and now - st_.up_since < HOLDDOWN - 1e-9:
                    others = [o for o in range(RAILS) if o != r and pol.eligible(e.status[o], now)
                              and not held >> o & 1]
                    assert not others, (r, others, self._state())

    @invariant()
    def a_pair_with_a_working_rail_uses_one(self):
        if not hasattr(self, "pair"):
            return
        p = self.pair
        quiet = p.now - p.changed_at
        if any(p.works(r) for r in range(RAILS)):
            for e in p.ends:
                # (a pair on a relay that works leaves it for a rail once that is past its hold-down)
                relayed = e.relay is not None and e.relay.confirmed
                if quiet > DETECT + 2 * RECONNECT_MAX + 0.1 + (HOLDDOWN if relayed else 0.0):
                    assert e.active, (quiet, self._state())


def test_a_relayed_pair_keeps_its_relay_until_a_repaired_rail_is_past_its_hold_down():
    """Host 0 cut off from every rail for 2.5 s, a third rank relaying: once repaired, the links
    come back (a re-dial), the working relay carries on through the rails' hold-down, then both
    ends go back to the primary and the relay ends. (Found by the model when it learned the
    relay's timers: its bound for "uses a rail" had left out a relay's hold-down.)"""
    p = Pair()
    p.set_third(True, False)
    for rail in range(RAILS):
        p.set_carrier(0, rail, False)
    p.advance(2.5)
    assert all(e.relay is not None and e.relay.confirmed and not e.active for e in p.ends)
    for rail in range(RAILS):
        p.set_carrier(0, rail, True)
    p.advance(DETECT + 2 * RECONNECT_MAX + 0.1)
    assert all(e.relay is not None and not e.active for e in p.ends)  # the rails are in their hold-down
    assert all(st.state is State.UP for e in p.ends for st in e.status)
    p.advance(HOLDDOWN)
    assert all(e.relay is None and e.active == [0] for e in p.ends)
    assert [(me, ev) for _t, me, ev, _r in p.events if ev in ("relay_off", "failback")].count((0, "relay_off")) == 1


SETTINGS = settings(max_examples=int(os.environ.get("LINKESCAPE_MODEL_EXAMPLES", "300")), stateful_step_count=40,
                    deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@pytest.fixture(autouse=True)
def _no_project_constants(monkeypatch):
    """The searches are derandomized, so what they try must depend only on this file. Hypothesis
    (6.170 here) also draws, now and then, numbers written anywhere in the project's own modules;
    a change elsewhere (one struct offset in transport/tcp.py, 2026-12-08) then changed which
    examples ran here, and the planted bug of the peer's rail word went unfound in 300 examples.
    Its pool of the project's constants is left empty here (a private hook: where a version
    lacks it, nothing is patched)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a hypothesis without it
        yield
        return
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "CONSTANTS_CACHE"):
        yield  # pragma: no cover
        return
    empty = type(providers._get_local_constants())()
    monkeypatch.setattr(providers, "_get_local_constants", lambda: empty)
    providers.CONSTANTS_CACHE.cache.clear()  # (tuples computed with the project's constants)
    yield
    providers.CONSTANTS_CACHE.cache.clear()


def test_the_escape_policy_holds_its_invariants():
    run_state_machine_as_test(PairMachine, settings=SETTINGS)


# ------------------------------------------------------------ planted bugs: the model finds them
class NoHolddown(PathPolicy):
    """A policy that skips the hold-down: a repaired rail carries at once."""

    def eligible(self, link, now):
        return link.state is State.UP


class DownRailToo(PathPolicy):
    """A policy that keeps a rail whose link is down (a frame sent on a down link)."""

    def choose(self, links, now, avoid=0):
        got = super().choose(links, now, avoid)
        return got or [self.primary]


def _ignore_peer_word(self, word, now, local_down):
    self.peer_rails.apply(word)  # (read, then nothing done: the rails it says are down stay in use)


_relay_tick = P.PeerPaths.relay_tick


def _no_relay_silence(self, now, heartbeat, acked, unacked, writing, due):
    heard = self.relay_clock.heard
    self.relay_clock.heard = now  # (as if the peer had just spoken: the silence is never found)
    got = _relay_tick(self, now, heartbeat, acked, unacked, writing, due)
    self.relay_clock.heard = heard
    return got


@pytest.mark.parametrize("policy, patch, words", [
    (NoHolddown, None, "hold_down"),  # a hold-down skipped
    (DownRailToo, None, "known_down"),  # a frame sent on a down link
    (PathPolicy, ("peer_word", _ignore_peer_word), "known_down"),  # the peer's rail word ignored
    (PathPolicy, ("_relay_off", lambda self, why: None), "relay"),  # a relay kept after a rail is back
    (PathPolicy, ("failback", lambda self, now: False), "settle|uses_one|hold_down"),  # never back on a rail
    (PathPolicy, ("relay_heard", lambda self, now: None), "relayed|relay silent"),  # the peer's relayed frames unheard
    (PathPolicy, ("relay_tick", _no_relay_silence), "relay silent|no relay"),  # a relay's silence ignored
], ids=["no-hold-down", "down-link", "peer-word-ignored", "relay-kept", "no-failback", "relay-unheard",
        "relay-silence-ignored"])
def test_the_model_finds_a_planted_bug(policy, patch, words, monkeypatch):
    class Planted(PairMachine):
        policy_cls = policy
    if patch is not None:
        monkeypatch.setattr(P.PeerPaths, *patch)
    with pytest.raises(BaseException) as info:
        # (found, not shrunk: shrinking a planted bug's example takes minutes and proves nothing more;
        # up to 1,000 examples: the search stops at the first bug, and the peer's ignored rail word
        # took 300-600 of them, 2026-12-08)
        run_state_machine_as_test(Planted, settings=settings(SETTINGS, phases=[Phase.generate],
                                                             max_examples=max(1000, SETTINGS.max_examples),
                                                             report_multiple_bugs=False))
    errors = list(getattr(info.value, "exceptions", [info.value]))
    assert all(isinstance(e, AssertionError) for e in errors), errors
    text = " ".join(str(e) for e in errors)
    assert any(w in text or _in_tracebacks(errors, w) for w in words.split("|")), text[:2000]


def _in_tracebacks(errors, words):
    for e in errors:
        tb = e.__traceback__
        while tb is not None:
            if words in tb.tb_frame.f_code.co_name:
                return True
            tb = tb.tb_next
    return False


def _chaos_pairs(path):
    """The faults of a chaos schedule between hosts 0 and 1 (or the first pair it touches), as
    model steps: (time, what, rank, rail)."""
    sched = json.load(open(path))
    steps = []
    for f in sched["faults"]:
        for host, rail in f["targets"]:
            if host > 1 or rail >= RAILS:
                continue
            t0, t1 = f["at"], f["at"] + f["hold"]
            if f["kind"] == "flap":
                period = f.get("period", 0.5)
                t = t0
                while t < t1:
                    steps.append((t, "cut" if f["mode"] == "cut" else "black", host, rail, True))
                    steps.append((t + period / 2, "cut" if f["mode"] == "cut" else "black", host, rail, False))
                    t += period
            else:
                what = "cut" if f["mode"] == "cut" else "black"
                steps.append((t0, what, host, rail, True))
                steps.append((t1, what, host, rail, False))
    return sorted(steps)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(HERE, "*.json"))), ids=os.path.basename)
def test_chaos_schedules_as_seeds(path):
    """The fault schedules that found bugs on the testbed, replayed on the model (what falls on
    hosts 0 and 1): the invariants hold throughout and after."""
    machine = PairMachine()
    machine.start()
    pair = machine.pair
    for t, what, host, rail, on in _chaos_pairs(path):
        if t > pair.now:
            pair.advance(t - pair.now)
        if what == "cut":
            pair.set_carrier(host, rail, not on)
        else:
            pair.set_black(rail, on)
        machine.no_frame_on_a_link_known_down()
        machine.a_repaired_rail_waits_its_hold_down()
        machine.a_pair_with_a_working_rail_uses_one()
    machine.repair_everything()
    machine.settle()
    assert pair.ends[0].active == [0]
