"""The chaos analysis judges stalls against the issue-7 bounds, measures detection, finds false trips."""

from __future__ import annotations

import pytest

from linkescape.chaos import analysis
from linkescape.faults import scripted

T0 = 1000.0  # wall time of schedule offset 0
RATE = 1e9
SILENT, HB = 0.2, 0.05


def _step(k, t0, dur, kind="op", ops=(("all_reduce", "int32", 64),)):
    return {"k": k, "kind": kind, "ops": [list(o) for o in ops], "t0": T0 + t0, "t1": T0 + t0 + dur, "wrong": 0}


def _quiet_steps(start=30.0, n=20):
    """Enough quiet, fast steps of the same class to give a normal time of 2 ms."""
    return [_step(100 + i, start + 0.01 * i, 0.002) for i in range(n)]


def _run(faults, steps, hosts=2, events=None):
    sched = scripted(faults, hosts=hosts, rails=2, duration=60)
    log, ivs = [], []
    for f in sched.faults:
        for t0, t1, h, r, m in f.intervals():
            log.append({"fault": f.id, "action": "apply", "mechanism": m, "host": h, "rail": r, "ts": T0 + t0})
            log.append({"fault": f.id, "action": "repair", "mechanism": m, "host": h, "rail": r, "ts": T0 + t1})
            ivs.append((T0 + t0, T0 + t1, h, r, m))
    res = analysis.stalls({0: steps + _quiet_steps()}, ivs, log, sched, world=hosts, rate_bps=RATE, silent=SILENT,
                          heartbeat=HB, t_end=T0 + 60, events=events)
    rows = {}
    for v in res["violations"] + res["top"]:
        rows[v["k"]] = v
    return res, rows


def test_with_a_path_left_a_cut_allows_its_detection_plus_100_ms():
    cut = [{"kind": "cut", "host": 0, "rail": 0, "at": 10.0, "hold": 2.0}]
    res, rows = _run(cut, [_step(1, 9.99, 0.10)])  # 98 ms beyond normal: within 100 ms + 10 ms
    assert res["violation_count"] == 0 and rows[1]["condition"] == "path_left"
    assert rows[1]["bound"] == pytest.approx(0.1 + analysis.CUT_DETECT)
    res, rows = _run(cut, [_step(1, 9.99, 0.40)])
    assert res["violation_count"] == 1 and rows[1]["violation"]


def test_a_blackhole_allows_the_silent_timeout_and_a_heartbeat():
    bh = [{"kind": "blackhole", "host": 1, "rail": 0, "at": 10.0, "hold": 2.0}]
    res, rows = _run(bh, [_step(1, 10.0, 0.35)])
    assert res["violation_count"] == 0 and rows[1]["bound"] == pytest.approx(0.1 + SILENT + HB + 0.01)
    res, _ = _run(bh, [_step(1, 10.0, 0.50)])
    assert res["violation_count"] == 1


def test_no_path_allows_one_and_a_half_seconds_after_the_path_returns():
    iso = [{"kind": "isolate", "targets": [[1, 0], [1, 1]], "at": 10.0, "hold": 2.0}]
    res, rows = _run(iso, [_step(1, 9.9, 2.1 + 1.4)])  # path back at 12.0, done 1.4 s later
    assert res["violation_count"] == 0 and rows[1]["condition"] == "no_path"
    assert rows[1]["stall"] > 3.0  # the stall itself is long; the bound is what counts
    res, rows = _run(iso, [_step(1, 9.9, 2.1 + 1.7)])
    assert res["violation_count"] == 1 and rows[1]["condition"] == "no_path"
    res, rows = _run(iso, [_step(1, 12.5, 0.9)])  # started after the path came back, still recovering
    assert res["violation_count"] == 0 and rows[1]["condition"] == "after_no_path"
    res, rows = _run(iso, [_step(1, 10.5, 1.0)])  # ended during the outage: nothing to judge
    assert rows[1]["condition"] == "during_no_path" and not rows[1]["violation"]


def test_cross_is_no_path_and_lossy_only_is_degraded():
    cross = [{"kind": "cross", "targets": [[0, 0], [1, 1]], "at": 10.0, "hold": 1.0}]
    _, rows = _run(cross, [_step(1, 9.95, 2.0)])
    assert rows[1]["condition"] == "no_path"
    deg = [{"kind": "cut", "host": 0, "rail": 1, "at": 5.0, "hold": 10.0},
           {"kind": "lossy", "host": 0, "rail": 0, "at": 10.0, "hold": 1.0, "loss": 10}]
    _, rows = _run(deg, [_step(1, 9.95, 2.0)])
    assert rows[1]["condition"] == "degraded"


def test_failback_stalls_are_judged_and_quiet_ones_are_the_baseline():
    cut = [{"kind": "cut", "host": 0, "rail": 0, "at": 10.0, "hold": 1.0}]
    back = {0: [{"ts": T0 + 12.2, "event": "failback", "peer": 1, "rail": 0, "from_rail": 1, "cause": None}]}
    res, rows = _run(cut, [_step(1, 12.0, 0.5), _step(2, 20.0, 0.6), _step(3, 13.0, 0.7)], events=back)
    assert rows[1]["condition"] == "failback" and rows[1]["violation"]  # traffic moved back during it
    assert rows[3]["condition"] == "after_repair"  # after the repair, but the library did nothing then
    assert rows[2]["condition"] == "no_fault"
    assert res["violation_count"] == 1  # the quiet steps are reported, not judged
    assert res["baseline_longest"]["k"] == 3 and res["baseline_over_100ms"] == 2


def test_a_step_is_judged_from_the_last_call_it_waits_for():
    # rank 1 checks a big result for 250 ms before it calls step 1; rank 0 waits in it for rank 1
    # (an all_reduce), rank 2 for nobody it needs (a scatter rooted at 2, received by 0 and 1)
    def rec(k, t0, dur, waits, ops=(("all_reduce", "int32", 64),)):
        return {**_step(k, t0, dur, ops=ops), "waits": waits}

    scatter = (("scatter", "float64", 32),)
    steps = {0: [rec(1, 40.0, 0.252, [1, 2]), rec(2, 40.3, 0.202, [2], scatter)],
             1: [rec(1, 40.25, 0.002, [0, 2]), rec(2, 40.5, 0.002, [2], scatter)],
             2: [rec(1, 40.0, 0.252, [0, 1]), rec(2, 40.3, 0.202, [0, 1], scatter)]}
    quiet = [rec(100 + i, 30.0 + 0.01 * i, 0.002, [1, 2]) for i in range(20)]
    quiet_scatter = [rec(200 + i, 31.0 + 0.01 * i, 0.002, [2], scatter) for i in range(20)]
    steps[0] = steps[0] + quiet + quiet_scatter
    res = analysis.stalls(steps, [], [], scripted([], hosts=3, rails=2, duration=60), world=3, rate_bps=RATE,
                          silent=SILENT, heartbeat=HB, t_end=T0 + 60)
    # step 1: ranks 0 and 2 waited 250 ms for rank 1's call; step 2: rank 2 (the root) waited 200 ms for
    # rank 1's, while rank 0 waited for the root only, which called in time: its 200 ms are its own
    assert {(r["rank"], r["k"]) for r in res["top"] if r["stall"] > 0.005} == {(0, 2)}
    assert res["top"][0]["stall"] == pytest.approx(0.2, abs=0.005)
    row = res["top"][1]  # (the stalls tie at 0 after it: in the order judged, rank 0's step 1 first)
    assert (row["rank"], row["k"]) == (0, 1) and row["start"] == pytest.approx(T0 + 40.25)
    assert row["waited"] == pytest.approx(0.25) and row["duration"] == pytest.approx(0.252)


def test_a_record_without_waits_and_a_run_of_parts_keep_their_own_calls():
    def rec(k, t0, waits):
        return {**_step(k, t0, 0.3), "waits": waits}

    # part 2 starts at step 0 again: its step 1 is not part 1's
    steps = {0: [rec(0, 10.0, [1]), rec(1, 10.5, [1]), rec(0, 50.0, [1]), rec(1, 50.5, [1]), _step(2, 51.0, 0.3)],
             1: [rec(0, 10.0, [0]), rec(1, 10.75, [0]), rec(0, 50.0, [0]), rec(1, 50.6, [0]), _step(2, 51.2, 0.1)]}
    got = analysis.with_starts(steps)
    assert [r["start"] for r in got[0]] == pytest.approx([T0 + 10.0, T0 + 10.75, T0 + 50.0, T0 + 50.6, T0 + 51.0])
    assert got[0][0] is not steps[0][0] and "start" not in steps[0][0]  # the caller's records stay as they were
    # the all_reduce of the stop flag after step 1 is a step of its own, after step 1 and before step 2
    stop = {0: [rec(1, 10.0, [1]), {**rec(1, 10.4, [1]), "kind": "stop"}, rec(2, 10.6, [1])],
            1: [rec(1, 10.0, [0]), {**rec(1, 10.5, [0]), "kind": "stop"}, rec(2, 10.6, [0])]}
    assert [r["start"] for r in analysis.with_starts(stop)[0]] == pytest.approx([T0 + 10.0, T0 + 10.5, T0 + 10.6])
    # never later than its own end
    late = {0: [rec(0, 10.0, [1])], 1: [rec(0, 12.0, [0])]}
    assert analysis.with_starts(late)[0][0]["start"] == pytest.approx(T0 + 10.3)


def test_normal_time_comes_from_quiet_steps_of_the_same_class_or_the_wire():
    big = ("all_reduce", "float32", 4 << 20)
    wire = analysis.wire_bytes("all_reduce", 4 << 20, 2) * 8 / RATE
    res, rows = _run([], [_step(1, 40.0, wire + 0.05, ops=(big,))])
    assert rows[1]["normal"] == pytest.approx(wire) and rows[1]["stall"] == pytest.approx(0.05)


def test_detection_latency_local_and_peer_and_misses():
    sched = scripted([{"kind": "cut", "host": 0, "rail": 1, "at": 1.0, "hold": 1.0},
                      {"kind": "lossy", "host": 1, "rail": 0, "at": 5.0, "hold": 1.0, "loss": 1}], hosts=3, rails=2)
    log = [{"fault": 0, "action": "apply", "mechanism": "cut", "host": 0, "rail": 1, "ts": 11.0},
           {"fault": 1, "action": "apply", "mechanism": "lossy", "host": 1, "rail": 0, "ts": 15.0}]
    ivs = [(11.0, 12.0, 0, 1, "cut"), (15.0, 16.0, 1, 0, "lossy")]
    events = {0: [{"ts": 11.002, "event": "link_down", "peer": 1, "rail": 1, "cause": "carrier"}],
              1: [{"ts": 11.004, "event": "failover", "peer": 0, "rail": 0, "from_rail": 1, "cause": "peer_carrier"},
                  {"ts": 11.5, "event": "link_down", "peer": 2, "rail": 1, "cause": "timeout"}],
              2: [{"ts": 11.3, "event": "link_down", "peer": 0, "rail": 1, "cause": "timeout"}]}
    det = analysis.detection(log, ivs, events, sched, {0: 0, 1: 1, 2: 2})["by_kind"]
    assert det["cut"]["local"]["n"] == 1 and det["cut"]["local"]["median_ms"] == pytest.approx(2.0)
    assert det["cut"]["peer"]["n"] == 2 and det["cut"]["peer"]["max_ms"] == pytest.approx(300.0)
    assert det["lossy"]["local"] == {"n": 0, "missed": 1}  # a 1 % lossy rail went unnoticed


def test_false_trips_are_link_downs_with_no_fault_on_either_end():
    ivs = [(10.0, 11.0, 0, 0, "cut")]
    events = {1: [{"ts": 10.5, "event": "link_down", "peer": 0, "rail": 0, "cause": "peer_carrier"},
                  {"ts": 30.0, "event": "link_down", "peer": 2, "rail": 1, "cause": "timeout"},
                  {"ts": 13.0, "event": "link_down", "peer": 0, "rail": 0, "cause": "socket_error"}]}
    ft = analysis.false_trips(events, ivs, {0: 0, 1: 1, 2: 2})
    assert ft["count"] == 1 and ft["examples"][0]["ts"] == 30.0
    assert ft["after_repair"] == 1


def test_tcp_counters_between_two_times():
    tcp = [[0.0, [{"rto": 1, "retrans": 5}, {"rto": 0, "retrans": 0}]],
           [1.0, [{"rto": 3, "retrans": 9}, {"rto": 2, "retrans": 1}]],
           [2.0, [{"rto": 3, "retrans": 9}, None]]]
    assert analysis.tcp_between(tcp, 0.2, 0.8) == {"rto": 4, "retrans": 5}


def test_a_step_during_an_undetected_lossy_rail_allows_the_grey_failure_detection():
    lossy = [{"kind": "lossy", "host": 0, "rail": 0, "at": 10.0, "hold": 3.0, "loss": 15}]
    res, rows = _run(lossy, [_step(1, 11.0, 1.2)])  # TCP crawls on the lossy path; nothing has left it yet
    assert rows[1]["condition"] == "lossy_path_left"
    assert rows[1]["bound"] == pytest.approx(0.1 + analysis.LOSSY_DETECT) and res["violation_count"] == 0
    res, rows = _run(lossy, [_step(1, 11.0, 1.8)])
    assert res["violation_count"] == 1 and rows[1]["violation"]
    # once the library has left the lossy rail (link_down on it), only what is left of the detection counts
    left = {0: [{"ts": T0 + 10.8, "event": "link_down", "peer": 1, "rail": 0, "cause": "degraded"}]}
    res, rows = _run(lossy, [_step(1, 11.0, 0.5)], events=left)
    assert rows[1]["condition"] == "path_left"
    assert rows[1]["bound"] == pytest.approx(0.1 + (10.0 + analysis.LOSSY_DETECT - 11.0))
    res, rows = _run(lossy, [_step(1, 11.0, 0.9)], events=left)
    assert res["violation_count"] == 1


def test_an_idle_link_of_a_blackholed_nic_is_found_from_its_first_use():
    # seed 1, 60 s (make test, 2026-12-05): h1r0 blackholed at 50.36 s; the links 1-0 and 1-3 on it were
    # left 250 ms later, but 1-2 was idle and was only found 200 ms after a step began to use it at
    # 50.62 s (its stall: 190 ms). No link is heartbeated for nothing, so the step could not know sooner.
    bh = [{"kind": "blackhole", "host": 1, "rail": 0, "at": 10.0, "hold": 3.0}]
    full = 0.1 + SILENT + HB + 0.01
    # 1-0 left at 10.25 (rank 1's end); 1-2 left at 10.45, at rank 2's end only: left all the same
    found = {1: [{"ts": T0 + 10.25, "event": "link_down", "peer": 0, "rail": 0, "cause": "timeout"}],
             2: [{"ts": T0 + 10.45, "event": "link_down", "peer": 1, "rail": 0, "cause": "timeout"}]}
    res, rows = _run(bh, [_step(1, 10.3, 0.3)], hosts=3, events=found)  # 1-2 still up: a whole detection
    assert rows[1]["condition"] == "path_left" and rows[1]["bound"] == pytest.approx(full)
    assert res["violation_count"] == 0
    res, rows = _run(bh, [_step(1, 10.3, 0.45)], hosts=3, events=found)
    assert res["violation_count"] == 1 and rows[1]["violation"]
    # once every link of the NIC has been left, only what is left of the onset's detection (none): 100 ms
    res, rows = _run(bh, [_step(1, 10.5, 0.3)], hosts=3, events=found)
    assert rows[1]["condition"] == "path_left" and rows[1]["bound"] == pytest.approx(0.1)
    assert res["violation_count"] == 1


def test_a_link_reopened_on_a_still_lossy_nic_is_in_use_again():
    # seed 179, 1 h: a cross cut took h3r0's link down while h3r0 was lossy; the cut's repair re-opened the
    # link on the still-lossy NIC, and a 4 B ring step crawled 1.0 s on it (TCP retransmissions) before
    # the lossy fault ended. The NIC was in use again: the grey-failure bound, not 100 ms.
    lossy = [{"kind": "lossy", "host": 0, "rail": 0, "at": 10.0, "hold": 3.0, "loss": 15}]
    cut_and_back = {0: [{"ts": T0 + 10.2, "event": "link_down", "peer": 1, "rail": 0, "cause": "carrier"},
                        {"ts": T0 + 11.0, "event": "link_up", "peer": 1, "rail": 0, "cause": "carrier"}],
                    1: [{"ts": T0 + 10.2, "event": "link_down", "peer": 0, "rail": 0, "cause": "peer_carrier"},
                        {"ts": T0 + 11.0, "event": "link_up", "peer": 0, "rail": 0, "cause": "peer_carrier"}]}
    res, rows = _run(lossy, [_step(1, 11.4, 1.0)], events=cut_and_back)
    assert rows[1]["condition"] == "lossy_path_left" and res["violation_count"] == 0
    # while the link was left (10.2 to 11.0) the NIC carried nothing: only what is left of the detection
    res, rows = _run(lossy, [_step(1, 10.4, 0.3)], events=cut_and_back)
    assert rows[1]["condition"] == "path_left"
    # one end still holding the link down is enough to leave it
    one_end = {0: cut_and_back[0][:1], 1: cut_and_back[1]}
    res, rows = _run(lossy, [_step(1, 11.4, 0.3)], events=one_end)
    assert rows[1]["condition"] == "path_left"


def test_only_lossy_rails_left_is_judged_by_the_no_path_rule():
    deg = [{"kind": "cut", "host": 0, "rail": 1, "at": 5.0, "hold": 10.0},
           {"kind": "lossy", "host": 1, "rail": 0, "at": 10.0, "hold": 2.0, "loss": 10}]
    res, rows = _run(deg, [_step(1, 10.5, 2.5)])  # path clean again at 12.0; done 1.0 s later
    assert rows[1]["condition"] == "degraded" and not rows[1]["violation"]
    res, rows = _run(deg, [_step(1, 10.5, 3.2)])  # 1.7 s after the path came back
    assert rows[1]["condition"] == "degraded" and rows[1]["violation"]


def test_the_bounds_are_judged_above_the_runs_own_noise():
    cut = [{"kind": "cut", "host": 0, "rail": 0, "at": 10.0, "hold": 2.0}]
    # 100 quiet steps and 5 that stalled 250 ms with no fault anywhere near: this machine's noise
    noisy = [_step(300 + i, 40.0 + 0.3 * i, 0.252) for i in range(5)]
    many_quiet = [_step(400 + i, 42.0 + 0.01 * i, 0.002) for i in range(100)]
    res, rows = _run(cut, [_step(1, 10.0, 0.30)] + noisy + many_quiet)
    noise = res["noise"]
    assert noise["baseline_steps"] >= analysis.MIN_BASELINE
    assert noise["allowance_s"] == pytest.approx(0.25, abs=0.01)
    assert rows[1]["stall"] > rows[1]["bound"]  # beyond the bound alone ...
    assert res["beyond_bound_count"] == 1 and res["violation_count"] == 0  # ... but not beyond bound + noise
    res, rows = _run(cut, [_step(1, 10.0, 0.45)] + noisy + many_quiet)
    assert res["violation_count"] == 1 and rows[1]["allowance"] == pytest.approx(noise["allowance_s"])


def test_warm_up_steps_are_neither_judged_nor_the_baseline():
    cut = [{"kind": "cut", "host": 0, "rail": 0, "at": 10.0, "hold": 2.0}]
    many_quiet = [_step(400 + i, 42.0 + 0.01 * i, 0.002) for i in range(100)]
    # before the plan's offset 0 (ranks starting, the controller setting up): a step of 0.9 s
    first = _step(0, -1.0, 0.902)
    sched = scripted(cut, hosts=2, rails=2, duration=60)
    for warm, baseline_max in (((), 0.9), (((T0 - 3.0, T0),), 0.0)):
        res = analysis.stalls({0: [first, _step(1, 10.0, 0.30)] + many_quiet + _quiet_steps()},
                              [(T0 + 10.0, T0 + 12.0, 0, 0, "cut")], [], sched, world=2, rate_bps=RATE,
                              silent=SILENT, heartbeat=HB, t_end=T0 + 60, warm_up=warm)
        assert res["noise"]["max_s"] == pytest.approx(baseline_max, abs=0.01)
        assert res["violation_count"] == 1  # (the cut's step: 300 ms against 100 + 10 ms)
    warm = res["by_condition"]["warm_up"]
    assert warm["steps"] == 1 and warm["violations"] == 0 and warm["longest_stall_s"] == pytest.approx(0.9, abs=0.01)


def test_each_parts_warm_up_ends_at_its_plans_offset_0():
    from linkescape.chaos.report import warm_up

    data = {"parts": [{"t_start": 100.0, "t0": 103.0, "from": 0.0}, {"t_start": 300.0, "t0": 103.0, "from": 200.0},
                      {"t_start": None, "t0": None}]}
    assert warm_up(data) == [(100.0, 103.0), (300.0, 303.0)]


def test_too_few_baseline_steps_give_no_noise_allowance():
    cut = [{"kind": "cut", "host": 0, "rail": 0, "at": 10.0, "hold": 2.0}]
    res, _ = _run(cut, [_step(1, 10.0, 0.30), _step(2, 40.0, 0.252)])
    assert res["noise"]["baseline_steps"] < analysis.MIN_BASELINE and res["noise"]["allowance_s"] == 0.0
    assert res["violation_count"] == 1


# ------------------------------------------------------------------ relays (issue 16)
CROSS = {"kind": "cross", "targets": [[1, 0], [2, 1]], "at": 10.0, "hold": 8.0}


def test_a_cross_a_third_host_could_relay_allows_detection_plus_relay_set_up_only():
    res, rows = _run([CROSS], [_step(1, 9.99, 0.9)], hosts=4)  # hosts 0 and 3 have every rail: relayable
    assert rows[1]["condition"] == "relayable" and not rows[1]["violation"]
    # the detection of each NIC the cross took down (two carrier losses), + the relay's set-up
    assert rows[1]["bound"] == pytest.approx(0.1 + 2 * analysis.CUT_DETECT + analysis.RELAY_SETUP)
    res, rows = _run([CROSS], [_step(1, 9.99, 1.6)], hosts=4)  # the no-path rule would wait for the repair
    assert rows[1]["condition"] == "relayable" and rows[1]["violation"] and res["violation_count"] == 1
    res, rows = _run([CROSS], [_step(1, 13.0, 1.5)], hosts=4)  # in the middle of it: no waiting either
    assert rows[1]["condition"] == "relayable" and rows[1]["violation"]
    res, rows = _run([CROSS], [_step(1, 18.5, 0.5)], hosts=4)  # after it: the relay hands back
    assert rows[1]["condition"] == "after_relayable" and not rows[1]["violation"]
    blackholed = [{**CROSS, "mode": "blackhole"}]  # found by silence: the silent timeout is in the bound
    _, rows = _run(blackholed, [_step(1, 9.99, 1.0)], hosts=4)
    assert rows[1]["bound"] == pytest.approx(0.1 + 2 * (SILENT + HB + 0.01) + analysis.RELAY_SETUP)


def test_a_cross_nobody_can_relay_is_waited_out_as_before():
    _, rows = _run([CROSS], [_step(1, 9.99, 3.0)], hosts=3)  # host 0 is the only third host ...
    assert rows[1]["condition"] == "relayable"
    busy = [CROSS, {"kind": "cut", "host": 0, "rail": 1, "at": 9.0, "hold": 9.5}]  # ... and it lost a rail
    _, rows = _run(busy, [_step(1, 9.99, 3.0)], hosts=3)
    assert rows[1]["condition"] == "during_no_path" and not rows[1]["violation"]
    res, rows = _run(busy, [_step(1, 17.5, 1.2)], hosts=3)  # the path came back at 18.0: 0.7 s later is fine
    assert rows[1]["condition"] == "no_path" and not rows[1]["violation"]


def test_a_host_repaired_a_moment_ago_is_no_relay_yet():
    # hosts 0 and 3 were cut until 9.6 s: their links re-open, so no relay until 10.6 s
    settling = [CROSS, {"kind": "cut", "host": 0, "rail": 0, "at": 8.0, "hold": 1.5},
                {"kind": "cut", "host": 3, "rail": 1, "at": 8.0, "hold": 1.6}]
    _, rows = _run(settling, [_step(1, 10.0, 0.4), _step(2, 11.0, 0.9), _step(3, 12.2, 1.5)], hosts=4)
    assert rows[1]["condition"] == "during_no_path"
    assert rows[2]["condition"] == "after_no_path"  # the relay may still be being set up
    assert rows[3]["condition"] == "relayable" and rows[3]["violation"]  # by then it must carry the pair


def _applied(sched):
    """The runner's log and the fault intervals of a schedule applied on time."""
    log, ivs = [], []
    for f in sched.faults:
        for t0, t1, h, r, m in f.intervals():
            log.append({"fault": f.id, "action": "apply", "mechanism": m, "host": h, "rail": r, "ts": T0 + t0})
            ivs.append((T0 + t0, T0 + t1, h, r, m))
    return log, ivs


def _ev(ts, rank, kind, peer, **kw):
    return {"ts": T0 + ts, "event": kind, "rank": rank, "peer": peer, **kw}


def test_relays_are_counted_timed_and_matched_to_the_cross_faults():
    sched = scripted([CROSS, {**CROSS, "id": 1, "at": 30.0, "hold": 5.0}], hosts=4, rails=2, duration=60)
    log, ivs = _applied(sched)
    events = {1: [_ev(10.05, 1, "relay_on", 2, via=3), _ev(19.0, 1, "relay_off", 2, via=3, cause="path_back")],
              2: [_ev(10.04, 2, "relay_on", 1, via=3), _ev(14.0, 2, "relay_off", 1, via=3, cause="via_lost"),
                  _ev(14.2, 2, "relay_on", 1, via=0), _ev(19.1, 2, "relay_off", 1, via=0, cause="path_back")]}
    rel = analysis.relays(events, ivs, log, sched, t_start=T0, t_end=T0 + 60)
    assert rel["relay_on"] == 3 and rel["relay_off"] == {"path_back": 2, "via_lost": 1}
    assert rel["pairs"] == 1 and rel["relayed_s"] == pytest.approx(9.06)  # 10.04 .. 19.1, both ends merged
    assert rel["via"] == {"0": 1, "3": 2} and rel["longest_s"] == pytest.approx(8.95)
    first, second = rel["cross_samples"]
    assert first["relay_possible"] and first["relay_on_s"] == pytest.approx(0.04)
    assert second["relay_possible"] and second["relay_on_s"] is None  # never relayed
    assert rel["cross_setup"]["n"] == 1 and rel["cross_setup"]["missed"] == 1
    assert rel["relayable_s"] == pytest.approx(13.0) and rel["longest_unrelayable_s"] == 0.0


def test_a_cross_that_meets_its_pair_already_relayed_is_relayed_at_once():
    # make test, 2026-12-07: relay_after_refusals.json's cross (hosts 0 and 2) came while the pair was
    # still relayed through rank 3 since the flaps before it; no relay_on followed, none was needed
    sched = scripted([CROSS], hosts=4, rails=2, duration=30)
    log, ivs = _applied(sched)
    on_since = {1: [_ev(8.9, 1, "relay_on", 2, via=3), _ev(19.0, 1, "relay_off", 2, via=3, cause="path_back")]}
    rel = analysis.relays(on_since, ivs, log, sched, t_start=T0, t_end=T0 + 30)
    assert rel["cross_samples"][0]["relay_on_s"] == 0.0
    assert rel["cross_setup"]["n"] == 1 and rel["cross_setup"]["missed"] == 0
    # a relay that ended just as the cross came does not carry it
    ended = {1: [_ev(8.9, 1, "relay_on", 2, via=3), _ev(10.1, 1, "relay_off", 2, via=3, cause="path_back")]}
    rel = analysis.relays(ended, ivs, log, sched, t_start=T0, t_end=T0 + 30)
    assert rel["cross_samples"][0]["relay_on_s"] is None and rel["cross_setup"]["missed"] == 1
