"""The fault schedule: random plans from a seed, scripted plans, steps and paths."""

from __future__ import annotations

import pytest

from linkescape.errors import UsageError
from linkescape.faults import (ISOLATE_BOUND, KINDS, Schedule, ScheduleError, path_timeline, random_schedule,
                               scripted)


def test_a_seed_reproduces_the_plan_and_another_seed_does_not():
    a = random_schedule(7, 120, 4, 2)
    b = random_schedule(7, 120, 4, 2)
    c = random_schedule(8, 120, 4, 2)
    assert a.to_dict() == b.to_dict()
    assert a.to_dict()["faults"] != c.to_dict()["faults"]
    assert a.seed == 7 and a.params["interval"] == 1.0


def test_random_plan_has_every_kind_within_its_rules():
    s = random_schedule(3, 300, 4, 2, warmup=2.0, tail=3.0, max_active=3)
    assert set(s.counts()) == set(KINDS)
    assert 200 <= len(s.faults) <= 400  # about one a second
    for f in s.faults:
        assert f.at >= 2.0 and f.end <= 300 - 3.0 + 1e-9
        active = sum(1 for g in s.faults if g.at <= f.at < g.end)
        assert active <= 3
        if f.kind == "isolate":
            assert len(f.hosts) == 1 and sorted(r for _, r in f.targets) == [0, 1]
            assert f.hold < ISOLATE_BOUND and f.mode in ("cut", "blackhole")
        elif f.kind == "cross":
            a, b = f.hosts
            ra = {r for h, r in f.targets if h == a}
            rb = {r for h, r in f.targets if h == b}
            assert ra and rb and not ra & rb and ra | rb == {0, 1} and f.hold < ISOLATE_BOUND
        elif f.kind == "lossy":
            assert 1.0 <= f.loss <= 20.0 and f.mode == "lossy"
        elif f.kind == "flap":
            assert 0.2 <= f.period <= 1.0 and f.hold == pytest.approx(f.period * round(f.hold / f.period))
        else:
            assert f.mode == f.kind and len(f.targets) == 1


def test_kinds_can_be_chosen_and_bad_parameters_are_typed_errors():
    s = random_schedule(1, 60, 3, 2, kinds=("cut",))
    assert set(s.counts()) == {"cut"}
    with pytest.raises(ScheduleError):
        random_schedule(1, 60, 3, 2, kinds=("melt",))
    with pytest.raises(ScheduleError):
        random_schedule(1, 60, 1, 2, kinds=("cross",))
    with pytest.raises(ScheduleError):
        random_schedule(1, 60, 2, 2, loss=(0, 200))
    assert issubclass(ScheduleError, UsageError)


def test_json_round_trip_and_the_short_scripted_form():
    s = random_schedule(5, 60, 4, 2)
    assert Schedule.from_json(s.to_json()).to_dict() == s.to_dict()
    p = scripted([{"kind": "cut", "host": 1, "rail": 0, "at": 1, "hold": 2},
                  {"kind": "lossy", "host": 0, "rail": 1, "at": 0.5, "hold": 1, "loss": 5}], hosts=2, rails=2)
    assert [f.kind for f in p.faults] == ["lossy", "cut"]  # sorted by start
    assert p.duration == 3.0 and p.faults[1].targets == ((1, 0),) and p.faults[0].mode == "lossy"
    with pytest.raises(ScheduleError):
        Schedule.from_json("{not json")
    with pytest.raises(ScheduleError):
        Schedule.from_json('{"faults": []}')


@pytest.mark.parametrize("bad", [
    {"kind": "melt", "host": 0, "rail": 0, "at": 0, "hold": 1},
    {"kind": "cut", "host": 5, "rail": 0, "at": 0, "hold": 1},
    {"kind": "cut", "host": 0, "rail": 0, "at": 0, "hold": 0},
    {"kind": "cut", "host": 0, "rail": 0, "at": 0, "hold": 99},
    {"kind": "lossy", "host": 0, "rail": 0, "at": 0, "hold": 1},
    {"kind": "flap", "host": 0, "rail": 0, "at": 0, "hold": 1},
    {"kind": "isolate", "targets": [[0, 0]], "at": 0, "hold": 1},
    {"kind": "cross", "targets": [[0, 0], [1, 0]], "at": 0, "hold": 1},
    {"kind": "blackhole", "host": 0, "rail": 0, "at": 0, "hold": 1, "mode": "cut"},
    {"kind": "cut", "at": 0, "hold": 1},
])
def test_invalid_scripted_faults_are_refused(bad):
    with pytest.raises(ScheduleError):
        scripted([bad], hosts=2, rails=2, duration=10)


def test_steps_expand_flaps_and_put_repairs_first():
    s = scripted([{"kind": "flap", "host": 0, "rail": 1, "at": 1.0, "hold": 1.0, "period": 0.5},
                  {"kind": "cut", "host": 1, "rail": 0, "at": 0.0, "hold": 1.0}], hosts=2, rails=2)
    steps = [(st.t, st.action, st.host, st.rail) for st in s.steps()]
    assert steps == [(0.0, "apply", 1, 0), (1.0, "repair", 1, 0), (1.0, "apply", 0, 1), (1.25, "repair", 0, 1),
                     (1.5, "apply", 0, 1), (1.75, "repair", 0, 1)]


def test_path_timeline_tells_clean_degraded_and_no_path_apart():
    def states(faults, hosts=3):
        s = scripted(faults, hosts=hosts, rails=2, duration=10)
        return [(a, b, st) for a, b, st in path_timeline(s.intervals(), hosts, 2, t_end=10)]

    # one rail down: every pair still has the other one
    assert states([{"kind": "cut", "host": 0, "rail": 0, "at": 1, "hold": 2}]) == [(1, 10, "clean")]
    # isolate: no path to host 0
    iso = states([{"kind": "isolate", "targets": [[0, 0], [0, 1]], "at": 1, "hold": 2}])
    assert iso == [(1, 3, "no_path"), (3, 10, "clean")]
    # cross: hosts 0 and 1 share no rail; host 2 still reaches both, but the pair has no path
    cross = states([{"kind": "cross", "targets": [[0, 0], [1, 1]], "at": 2, "hold": 1}])
    assert (2, 3, "no_path") in cross
    # a cut rail and a lossy one: only a lossy path is left
    deg = states([{"kind": "cut", "host": 0, "rail": 1, "at": 0, "hold": 4},
                  {"kind": "lossy", "host": 1, "rail": 0, "at": 1, "hold": 1, "loss": 10}])
    assert (1, 2, "degraded") in deg and deg[0] == (0, 1, "clean")


def test_window_replays_a_stretch_from_zero():
    s = random_schedule(2, 120, 4, 2)
    w = s.window(30, 40)
    assert w.faults and all(0 <= f.at < 10 for f in w.faults)
    orig = {f.id: f for f in s.faults}
    for f in w.faults:
        assert f.at == pytest.approx(orig[f.id].at - 30) and f.targets == orig[f.id].targets


def test_with_relays_a_cross_a_third_host_reaches_is_relayable_and_only_what_none_reaches_is_no_path():
    from linkescape.faults import unrelayable_stretches

    def states(faults, hosts=3, settle=0.0):
        s = scripted(faults, hosts=hosts, rails=2, duration=20)
        return [(a, b, st) for a, b, st in path_timeline(s.intervals(), hosts, 2, t_end=20, relay=True,
                                                         settle=settle)]

    cross = {"kind": "cross", "targets": [[0, 0], [1, 1]], "at": 2, "hold": 6}
    assert states([cross]) == [(2, 8, "relayable"), (8, 20, "clean")]  # host 2 has both rails
    assert states([cross], hosts=2) == [(2, 8, "no_path"), (8, 20, "clean")]  # nobody to relay
    # host 2 loses a rail for a while: no relay then
    busy = [cross, {"kind": "cut", "host": 2, "rail": 1, "at": 4, "hold": 2}]
    assert states(busy) == [(2, 4, "relayable"), (4, 6, "no_path"), (6, 8, "relayable"), (8, 20, "clean")]
    # ... and a relay only once its links are re-opened (settle)
    assert states(busy, settle=1.0)[1:3] == [(4, 7, "no_path"), (7, 8, "relayable")]
    # an isolated host cannot be relayed to
    iso = [{"kind": "isolate", "targets": [[0, 0], [0, 1]], "at": 1, "hold": 2}]
    assert states(iso, hosts=4)[0] == (1, 3, "no_path")
    s = scripted(busy, hosts=3, rails=2, duration=20)
    # hosts 0 and 2 share no rail either then, and host 1 has lost one: nobody relays for them
    assert unrelayable_stretches(s.intervals(), 3, 2) == {(0, 1): [(4, 6)], (0, 2): [(4, 6)]}
    # a rail being re-opened carries its own pair again, but relays for nobody yet
    assert unrelayable_stretches(s.intervals(), 3, 2, settle=1.0) == {(0, 1): [(4, 7)], (0, 2): [(4, 6)]}
    two = scripted([cross, {"kind": "cross", "targets": [[2, 0], [3, 1]], "at": 3, "hold": 2}], hosts=4, rails=2,
                   duration=20)
    # two crosses: no host keeps both rails, and every pair across the two rails is cut off
    assert unrelayable_stretches(two.intervals(), 4, 2) == {p: [(3, 5)] for p in ((0, 1), (0, 3), (1, 2), (2, 3))}


def test_cross_hold_draws_long_crosses_and_leaves_the_rest_of_the_draws_alone():
    a = random_schedule(6, 300, 4, 2)
    b = random_schedule(6, 300, 4, 2, cross_hold=(15.0, 25.0))
    crosses = [f for f in b.faults if f.kind == "cross"]
    assert crosses and all(15.0 <= f.hold <= 25.0 for f in crosses)
    for f in crosses:  # one at a time, else no host keeps every rail to relay
        assert not [g for g in crosses if g is not f and g.at <= f.at < g.end]
    first = next(f for f in a.faults if f.kind == "cross")
    same = [f for f in a.faults if f.at < first.at]
    assert [g.to_dict() for g in b.faults[:len(same)]] == [g.to_dict() for g in same]  # same draws before it
    with pytest.raises(ScheduleError):
        random_schedule(6, 300, 4, 2, cross_hold=(5.0, 2.0))


def test_concatenated_parts_are_played_one_after_the_other():
    from linkescape.faults import concatenate

    one, two = random_schedule(1, 60, 4, 2), random_schedule(2, 40, 4, 2)
    s = concatenate([(one, {"policy": "active-backup"}), (two, {"policy": "stripe"})])
    assert s.duration == 100 and len(s.faults) == len(one.faults) + len(two.faults)
    assert [f.id for f in s.faults] == sorted(f.id for f in s.faults) and len({f.id for f in s.faults}) == len(s.faults)
    assert s.parts() == [{"policy": "active-backup", "from": 0.0, "to": 60.0, "seed": 1},
                         {"policy": "stripe", "from": 60.0, "to": 100.0, "seed": 2}]
    p2 = s.part_schedule(s.parts()[1])
    assert [f.at - 60 for f in p2.faults] == pytest.approx([f.at for f in two.faults])
    assert all(f.end <= 100 - 3 + 1e-6 for f in p2.faults)
    assert Schedule.from_json(s.to_json()).parts() == s.parts()
    assert random_schedule(1, 60, 4, 2).parts() == [{"from": 0.0, "to": 60, "policy": None, "seed": 1}]
