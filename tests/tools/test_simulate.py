"""`linkescape simulate`: the play of one schedule against cases computed by hand, and the Monte Carlo."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.tools.baselines import modes
from linkescape.tools.simulate import Failure, SimParams, draw_faults, play, simulate

T = 100.0  # hours
# one host of 8 GPUs, 2 rails, no drawn faults; checkpoint every 4 h of progress (written for free),
# restart 1 h; no wait for a path. Stripe at 0.5x with one rail less and half the step on the
# network: the step takes (1 - 0.5) + 0.5 / 0.5 = 1.5, speed 2/3
HAND = SimParams(gpus=8, gpus_per_host=8, rails=2, days=T / 24, checkpoint_hours=4.0, checkpoint_write_s=0.0,
                 restart_hours=1.0, escape_stall_ms=0.0, comm_share=0.5, drain=False, policy="stripe",
                 stripe_fault_rate=0.5, no_path_s=0.0, nic_per_day=0.0, cable_per_day=0.0, switch_per_day=0.0,
                 other_per_gpu_day=0.0, trials=1)
TWO = replace(HAND, gpus=16)  # two hosts


def ettr(p, faults, mode):
    return play(p, faults, mode).work_hours / T


def test_no_fault():
    assert ettr(HAND, [], False) == 1.0 and ettr(HAND, [], True) == 1.0


def test_single_rail_faults_by_hand():
    faults = [Failure(10.0, 0, "cable", 0, 2.0), Failure(50.0, 0, "optic", 1, 2.0)]
    # restart: at 10 h, 2 h since the checkpoint at 8 h are lost, back at 11 h; at 50 h, 39 h
    # after the restart, 3 h since the checkpoint at 36 h (of those 39) are lost; back at 51 h
    assert ettr(HAND, faults, False) == pytest.approx((10 - 2 + 39 - 3 + 49) / T)
    # escape (stripe): two 2-hour stretches at 2/3 speed, nothing lost
    assert ettr(HAND, faults, True) == pytest.approx((100 - 2 * 2 * (1 - 2 / 3)) / T)
    r = play(HAND, faults, True)
    assert (r.interruptions, r.escaped, r.degraded_hours) == (0, 2, pytest.approx(4.0))
    # active-backup at its measured 1.00x: nothing lost at all
    assert ettr(replace(HAND, policy="active-backup"), faults, True) == 1.0


def test_the_stall_of_each_escape_is_counted():
    p = replace(HAND, escape_stall_ms=3.6e6)  # one hour, to see it
    faults = [Failure(10.0, 0, "cable", 0, 2.0)]
    assert ettr(p, faults, True) == pytest.approx((100 - 2 / 3 - 2 * (1 - 2 / 3)) / T)


def test_checkpoint_writes_cost_their_share():
    # 0.4 h written every 4 h of progress: progress runs at 4 / 4.4
    p = replace(HAND, checkpoint_write_s=0.4 * 3600)
    assert ettr(p, [], False) == pytest.approx(4 / 4.4)
    # an interruption at 22 h: 20 h of progress, 4 h since the checkpoint at 16 h are lost... 20 mod 4 = 0
    r = play(p, [Failure(22.0, 0, "other")], False)
    assert r.lost_work_hours == pytest.approx(math.fmod(22 * 4 / 4.4, 4.0))


def test_young_daly_interval():
    p = SimParams(checkpoint_write_s=36.0)
    assert p.interval() == pytest.approx(math.sqrt(2 * 0.01 * p.mtbf_hours()))
    assert p.mtbf_hours() == pytest.approx(54 * 24 / 419)
    assert replace(p, checkpoint_hours=2.0).interval() == 2.0


def test_a_second_fault_before_the_repair_interrupts():
    faults = [Failure(10.0, 0, "cable", 0, 8.0), Failure(11.0, 0, "optic", 1, 8.0)]
    # at 11 h: 2 h (8 -> 10) + 1 h at 2/3 speed since the checkpoint are lost; back at 12 h
    r = play(HAND, faults, True)
    assert (r.interruptions, r.by_cause["isolated"], r.escaped) == (1, 1, 1)
    assert r.work_hours == pytest.approx(10 + 2 / 3 - (2 + 2 / 3) + 88)
    # the same rail twice is not a second rail
    assert play(HAND, [Failure(10.0, 0, "cable", 0, 8.0), Failure(11.0, 0, "optic", 0, 8.0)], True).interruptions == 0


def test_whole_host_faults_interrupt_both_alike_without_a_wait():
    faults = [Failure(10.0, 0, "nic", None, 2.0), Failure(50.0, 0, "switch", None, 2.0), Failure(70.0, 0, "other")]
    expect = (10 - 2 + 39 - 3 + (70 - 51) - (19 % 4) + 29) / T
    assert ettr(HAND, faults, False) == pytest.approx(expect)
    assert ettr(HAND, faults, True) == pytest.approx(expect)
    assert play(HAND, faults, True).by_cause["isolated"] == 2


def test_the_no_path_wait():
    p = replace(HAND, no_path_s=1800.0)
    # a host loses every rail at 10 h for 2 h: the job waits 0.5 h, then fails: 2 h lost, back at 11.5 h
    r = play(p, [Failure(10.0, 0, "switch", None, 2.0)], True)
    assert (r.interruptions, r.waits, r.waits_resolved) == (1, 1, 0)
    assert r.wait_hours == pytest.approx(0.5) and r.work_hours == pytest.approx(10 - 2 + 88.5)
    # repaired after 0.25 h: the wait ends, nothing is lost but the quarter hour
    r = play(p, [Failure(10.0, 0, "switch", None, 0.25)], True)
    assert (r.interruptions, r.waits_resolved) == (0, 1) and r.work_hours == pytest.approx(99.75)
    # another interruption during the wait ends it
    r = play(p, [Failure(10.0, 0, "switch", None, 2.0), Failure(10.2, 0, "other")], True)
    assert r.by_cause == {"other": 1, "network": 0, "isolated": 0, "cross": 0}
    assert r.work_hours == pytest.approx(10 - 2 + 100 - 11.2)


def test_a_cross_fault_with_and_without_relay():
    # host 0 loses rail 0 at 10 h, host 1 rail 1 at 11 h (both for 8 h): no rail in common.
    ab = replace(TWO, policy="active-backup", relay=False)
    faults = [Failure(10.0, 0, "cable", 0, 8.0), Failure(11.0, 1, "cable", 1, 8.0)]
    r = play(ab, faults, True)
    # without relay: an interruption at 11 h, 3 h since the checkpoint at 8 h lost, back at 12 h
    assert (r.interruptions, r.by_cause["cross"]) == (1, 1)
    assert r.work_hours == pytest.approx(11 - 3 + 88)
    # with relay at 0.5x: 11 h -> 18 h (host 0's repair) at 1 / (0.5 + 0.5 / 0.5) = 2/3 speed
    r = play(replace(ab, relay=True, relay_rate=0.5), faults, True)
    assert r.interruptions == 0 and r.relayed_hours == pytest.approx(7.0)
    assert r.work_hours == pytest.approx(100 - 7 / 3)
    # with 3 rails the two hosts still share one: no cross
    assert play(replace(ab, rails=3), faults, True).interruptions == 0


def test_a_switch_takes_a_rail_of_several_hosts():
    ab = replace(TWO, policy="active-backup")
    # a switch of two hosts loses rail 0 of both: escaped; then host 1 loses rail 1: isolated
    r = play(ab, [Failure(10.0, 0, "switch", 0, 8.0, span=2), Failure(12.0, 1, "nic", 1, 24.0)], True)
    assert (r.escaped, r.by_cause["isolated"]) == (1, 1)


def test_nccl_port_failover_by_hand():
    # 36 s to find the dead port, then the virtual NIC's other port: 0.5x, speed 2/3 until the repair
    p = replace(HAND, nccl_detect_s=36.0, policy="active-backup")
    faults = [Failure(10.0, 0, "cable", 0, 2.0)]
    r = play(p, faults, modes(p)["nccl"])
    assert r.interruptions == 0 and r.work_hours == pytest.approx(100 - 0.01 * 2 / 3 - 2 / 3)
    # one failed device per connection: a second fault on the host is fatal after the detection
    r = play(p, faults + [Failure(11.0, 0, "nic", 1, 8.0)], modes(p)["nccl"])
    assert (r.interruptions, r.by_cause["isolated"]) == (1, 1)
    # only inside merged virtual NICs
    assert play(replace(p, nccl_merged_share=0.0), faults, "nccl").interruptions == 1


def test_drain_swaps_a_degraded_host_at_the_next_checkpoint():
    p = replace(HAND, drain=True)
    # at 10 h, 2 h since the checkpoint: 2 more at 2/3 speed is 3 h: swapped at 13 h, no work
    # lost, back at 14 h (staying degraded for the 8 h repair would cost 8/3 h > the 1 h restart)
    r = play(p, [Failure(10.0, 0, "cable", 0, 8.0)], True)
    assert (r.planned_restarts, r.interruptions) == (1, 0)
    assert r.work_hours == pytest.approx(10 + 2 + 86)
    # a short repair is waited out
    r = play(p, [Failure(10.0, 0, "cable", 0, 1.0)], True)
    assert r.planned_restarts == 0 and r.work_hours == pytest.approx(100 - 1 / 3)


def test_a_fault_during_a_restart_restarts_it():
    faults = [Failure(10.0, 0, "other"), Failure(10.5, 0, "other")]
    r = play(HAND, faults, False)
    assert (r.interruptions, r.failed_restarts) == (1, 1)
    assert r.work_hours == pytest.approx(10 - 2 + 100 - 11.5)
    # under escape a fault of one rail during the restart is absorbed
    r = play(HAND, [Failure(10.0, 0, "other"), Failure(10.5, 0, "cable", 0, 2.0)], True)
    assert (r.interruptions, r.failed_restarts, r.absorbed) == (1, 0, 1)


def sim_json(*args):
    res = CliRunner().invoke(main, ["simulate", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


ZERO = ["--nic-rate", "0", "--cable-rate", "0", "--switch-rate", "0", "--optic-rate", "0", "--other-rate", "0"]


def test_cli_zero_failures():
    d = sim_json("--gpus", "4096", "--days", "10", "--checkpoint-write-seconds", "0", "--trials", "3", *ZERO)
    for mode in ("restart", "escape", "nccl"):
        assert d[mode]["ettr"] == 1.0 and d[mode]["interruptions"] == 0 and d[mode]["yuan_lost"] == 0
    assert d["interruptions_avoided"] == 0 and d["saved"]["escape"]["yuan_saved"] == 0


def test_cli_all_failures_whole_host():
    d = sim_json("--gpus", "16384", "--whole-host-share", "1", "--no-path-seconds", "0", "--trials", "5")
    fk = d["faults_per_run"]
    assert fk["whole_host"] == fk["nic"] + fk["cable"] + fk["optic"] + fk["switch"] > 0
    assert d["escape"]["ettr"] == pytest.approx(d["restart"]["ettr"], abs=1e-12) and d["restart"]["ettr"] < 1
    assert d["interruptions_avoided"] == 0 and d["escape"]["escaped"] == 0


def test_cli_all_failures_single_rail():
    # only network faults, every repair 2 h, 8 rails (never all down at once), no drain, stripe at
    # 0.5x: escape loses only the stretches on 7 of 8 rails and the stalls; restart a restart per fault
    d = sim_json("--gpus", "2048", "--rails", "8", "--nic-rate", "1e-4", "--cable-rate", "1e-4", "--switch-rate", "0",
                 "--other-rate", "0", "--repair-nic-hours", "2", "--repair-cable-hours", "2", "--no-drain",
                 "--policy", "stripe", "--stripe-fault-rate", "0.5", "--comm-share", "0.5", "--trials", "10",
                 "--checkpoint-write-seconds", "0")
    T = 54 * 24.0
    e, r = d["escape"], d["restart"]
    assert e["interruptions"] == 0 and e["escaped"] > 5
    s = 1 / (0.5 + 0.5 / 0.5)
    assert d["degraded_speed"] == pytest.approx(s)
    expect = 1 - ((1 - s) * e["degraded_hours"] + s * e["stall_seconds"] / 3600) / T
    assert e["ettr"] == pytest.approx(expect, rel=1e-9)
    assert e["degraded_hours"] <= 2 * (e["escaped"] + e["absorbed"]) + 1e-9
    total = sum(d["faults_per_run"][k] for k in ("nic", "cable", "optic", "switch"))
    assert r["interruptions"] + r["failed_restarts"] == pytest.approx(total)  # every fault stops the job
    assert e["escaped"] + e["absorbed"] == pytest.approx(total)  # none does
    assert 1 - r["ettr"] == pytest.approx((r["lost_work_hours"] + r["restart_hours"]) / T)
    assert d["interruptions_avoided"] == r["interruptions"] > 0


def test_fault_counts_follow_the_rates():
    import numpy as np

    p = SimParams(gpus=100_000, days=54)
    rng = np.random.default_rng(1)
    n = [len([f for f in draw_faults(p, rng) if f.kind == "other"]) for _ in range(20)]
    mean = p.rate("other") * p.gpus * p.days
    assert abs(sum(n) / 20 - mean) < 4 * math.sqrt(mean / 20)
    # Llama 3's cluster (one NIC per GPU) sees its network faults: 1.7 % and 8.4 % of 419
    fk = simulate(SimParams(trials=40))["faults_per_run"]
    assert fk["nic"] == pytest.approx(419 * 0.017, rel=0.25)
    assert fk["cable"] + fk["switch"] == pytest.approx(419 * 0.084, rel=0.15)
    assert fk["other"] == pytest.approx(419 * (1 - 0.101), rel=0.05)


@pytest.mark.parametrize("coverage,every_rail", [("rail-optimized", set()), ("dual-plane", {"nic"}),
                                                 ("tor", {"switch"})])
def test_what_each_fabric_preset_takes(coverage, every_rail):
    import numpy as np

    p = SimParams(coverage=coverage, nic_per_day=1e-3, cable_per_day=1e-3, switch_per_day=1e-3)
    faults = draw_faults(p, np.random.default_rng(0))
    for kind in ("nic", "cable", "switch"):
        fs = [f for f in faults if f.kind == kind]
        assert fs and all((f.rail is None) == (kind in every_rail) for f in fs), (coverage, kind)
    assert {f.span for f in faults if f.kind == "switch"} == {p.span}


def test_bad_input_is_refused():
    assert CliRunner().invoke(main, ["simulate", "--gpus", "0"]).exit_code == 2
    assert CliRunner().invoke(main, ["simulate", "--coverage", "mesh"]).exit_code == 2
    from linkescape.errors import UsageError

    with pytest.raises(UsageError):
        SimParams(whole_host_share=2)
    with pytest.raises(UsageError):
        SimParams(network_share=0.6, nic_share=0.6)


def test_plot(tmp_path):
    res = CliRunner().invoke(main, ["simulate", "--trials", "2", "--plot", str(tmp_path / "sim.png")])
    assert res.exit_code == 0, res.output
    data = (tmp_path / "sim.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
