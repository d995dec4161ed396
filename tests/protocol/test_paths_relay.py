"""protocol/paths.PeerPaths: the timers it decides, sans I/O (time passed in). The relay's
heartbeats, its silence (the route is lost after RELAY_SILENT without a word of the peer's) and
the resending of frames lost at the relay (RELAY_RTO, doubling to RELAY_SILENT, only while the
peer speaks); how often a link beats (a held rail's evidence); a link's silence (judge_silence)."""

from __future__ import annotations

from linkescape.protocol import paths as P
from linkescape.protocol.linkstate import Ev, PathPolicy

HB = 0.1


class Route:
    def __init__(self, via: int) -> None:
        self.via = via
        self.confirmed = False
        self.bytes = 0


def relayed(now: float = 0.0) -> P.PeerPaths:
    """A pair (rank 0 to rank 1, one rail) whose rail failed: relayed through rank 2 from ``now``."""
    paths = P.PeerPaths(0, 1, 1, PathPolicy(primary=0, holddown=1.0))
    paths.opened(0, 1, now, reopened=False)
    paths.failed(0, Ev.CARRIER_DOWN, now)
    paths.relay_started(Route(2), now)
    paths.take()
    return paths


def test_the_first_frame_of_the_peer_through_the_relay_confirms_it_once():
    paths = relayed()
    paths.relay_heard(0.05)
    assert paths.relay.confirmed and paths.no_path_since is None
    assert [type(a) for a in paths.take()] == [P.Emit, type(P.PATH_BACK)]
    paths.relay_heard(0.06)
    assert paths.take() == []  # (relay_on once)


def test_the_relay_beats_every_heartbeat_interval_and_says_when_next():
    paths = relayed()
    due = paths.relay_tick(0.05, HB, 0, 0, False, 9.0)
    assert P.RELAY_BEAT not in paths.take() and due == HB
    due = paths.relay_tick(HB, HB, 0, 0, False, 9.0)
    assert paths.take() == [P.RELAY_BEAT] and due == 2 * HB


def test_a_relay_that_carried_nothing_of_the_peers_for_relay_silent_is_lost():
    paths = relayed()
    route = paths.relay
    paths.relay_heard(0.5)
    paths.take()
    paths.relay_tick(0.5 + P.RELAY_SILENT, HB, 0, 0, False, 9.0)
    assert paths.relay is route  # (not past it yet)
    paths.take()
    paths.relay_tick(0.5 + P.RELAY_SILENT + 0.001, HB, 0, 0, False, 9.0)
    acts = paths.take()
    assert paths.relay is None and P.RelayEnded(route, "timeout") in acts and P.REPLAY in acts
    assert ("relay_off", "timeout") in [(a.event, a.cause) for a in acts if isinstance(a, P.Emit)]


def _resends(paths, until: float, acked: int = 0, unacked: int = 3, heard: bool = True):
    """Tick every 10 ms to ``until``, the peer speaking (``heard``) with its ack at ``acked``."""
    at = []
    t = 0.0
    while t < until - 1e-9:
        t = round(t + 0.01, 6)
        if heard:
            paths.relay_heard(t)
        paths.relay_tick(t, HB, acked, unacked, False, 9.0)
        acts = paths.take()
        if any(isinstance(a, P.Resend) for a in acts):
            assert P.REPLAY in acts
            at.append(t)
    return at


def test_frames_lost_at_the_relay_go_again_when_the_peers_ack_stands_still_the_wait_doubling():
    paths = relayed()
    assert _resends(paths, 1.5) == [0.2, 0.6, 1.4]  # waits of 0.2, then 0.4, then 0.8 s
    assert paths.relay_clock.resent == 3 and paths.relay_clock.rto == P.RELAY_SILENT


def test_no_frame_goes_again_to_a_peer_that_says_nothing_or_while_ours_are_still_being_written():
    paths = relayed()
    assert _resends(paths, 0.9, heard=False) == []  # starved or gone: the relay's silence judges
    paths = relayed()
    for i in range(1, 100):
        paths.relay_heard(i * 0.01)
        paths.relay_tick(i * 0.01, HB, 0, 3, True, 9.0)  # our sockets still hold frames: no verdict
        assert not any(isinstance(a, P.Resend) for a in paths.take())


def test_an_ack_that_moves_restarts_the_wait_and_nothing_unacked_stops_it():
    paths = relayed()
    t = 0.0
    for i in range(1, 60):
        t = i * 0.01
        paths.relay_heard(t)
        paths.relay_tick(t, HB, i, 3, False, 9.0)  # the ack moves every tick
        assert not any(isinstance(a, P.Resend) for a in paths.take())
    due = paths.relay_tick(t + 0.01, HB, 59, 0, False, 9.0)
    assert due <= t + 0.01 + HB and paths.relay_clock.rto == P.RELAY_RTO


def test_a_held_rail_beats_four_times_an_interval_an_engaged_one_once_an_idle_one_not():
    paths = P.PeerPaths(0, 1, 2, PathPolicy(primary=0, holddown=1.0))
    for rail in (0, 1):
        paths.opened(rail, 1, 0.0, reopened=False)
    paths.failed(1, Ev.TIMEOUT, 0.1)  # silent: held out until clean
    paths.opened(1, 2, 0.2, reopened=True)
    assert paths.avoid == 0b10
    assert paths.beat_every(1, False, HB) == HB / P.HELD_BEATS
    assert paths.beat_every(0, True, HB) == HB and paths.beat_every(0, False, HB) is None
    assert paths.beat_every(1, True, HB, calm=True) == HB / P.HELD_BEATS  # (held: its evidence, calm or not)


def test_a_busy_pairs_backup_beats_every_interval_unless_the_rank_is_calm():
    paths = P.PeerPaths(0, 1, 2, PathPolicy(primary=0, holddown=1.0))
    for rail in (0, 1):
        paths.opened(rail, 1, 0.0, reopened=False)
    assert paths.active == [0]
    assert paths.beat_every(1, True, HB) == HB  # a fault lately: the backup is kept known good
    assert paths.beat_every(1, True, HB, calm=True) == P.CALM_BEAT  # calm: it beats far less
    assert paths.beat_every(0, True, HB, calm=True) == HB  # the rail that carries the traffic: every interval
    assert paths.beat_every(1, False, HB, calm=True) is None  # idle: the probe budget's
    assert paths.beat_every(1, True, 2.0, calm=True) == 2.0  # (never more often than the interval)
    # striping: every rail carries the traffic
    striped = P.PeerPaths(0, 1, 2, PathPolicy(primary=0, holddown=1.0, stripe=True))
    for rail in (0, 1):
        striped.opened(rail, 1, 0.0, reopened=False)
    assert striped.active == [0, 1] and striped.beat_every(1, True, HB, calm=True) == HB


def test_silence_counts_from_when_bytes_were_first_seen_waiting_and_a_late_look_sends_a_follow_up():
    T, HB_ = 0.2, 0.05
    # nothing waits: no verdict, nothing pending
    assert P.judge_silence(1.0, None, False, 0.5, 0.9, False, T, HB_) == (False, False, None, 1.0 + T)
    # bytes seen waiting from now (the kernel's last ack is old: a pause), checked again when they could pass
    v, follow, since, at = P.judge_silence(1.0, 5.0, False, None, 1.0, False, T, HB_)
    assert (v, follow, since) == (False, False, 1.0) and abs(at - (1.0 + T)) < 1e-9
    # past the timeout with frames sent behind the waiting bytes: silent
    assert P.judge_silence(1.25, 5.0, False, 1.0, 1.1, False, T, HB_)[:2] == (True, False)
    # past it, but nothing went out behind them (a probed link looked at late): one more frame first
    assert P.judge_silence(1.25, 5.0, False, 1.0, 1.0, False, T, HB_) == (False, True, 1.0, 1.25 + HB_)
    # our clock jumped (a stall of ours): no verdict, counting starts again
    assert P.judge_silence(9.0, 8.0, True, 1.0, 1.1, False, T, HB_) == (False, False, 9.0, 9.0 + T)
