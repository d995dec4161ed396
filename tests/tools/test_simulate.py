"""`linkescape simulate` against cases computed by hand."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.tools.simulate import Fault, SimParams, draw_faults, play, simulate

T = 100.0  # hours
# one host of 8 GPUs, 2 rails; checkpoint every 4 h, restart 1 h; on one rail less the step
# takes (1 - 0.5) + 0.5 * 2 / 1 = 1.5: speed 2/3
HAND = SimParams(gpus=8, gpus_per_host=8, rails=2, days=T / 24, checkpoint_hours=4.0, restart_hours=1.0,
                 escape_stall_ms=0.0, comm_share=0.5, drain=False, other_per_gpu_day=0.0, trials=1)


def ettr(p, faults, escape):
    return play(p, faults, escape).work_hours / T


def test_no_fault():
    assert ettr(HAND, [], False) == 1.0 and ettr(HAND, [], True) == 1.0


def test_single_rail_faults_by_hand():
    faults = [Fault(10.0, 0, "cable", 0, 2.0), Fault(50.0, 0, "optic", 1, 2.0)]
    # restart: at 10 h, 2 h since the checkpoint at 8 h are lost, back at 11 h; at 50 h, 39 h
    # after the restart, 3 h since the checkpoint at 36 h (of those 39) are lost; back at 51 h
    assert ettr(HAND, faults, False) == pytest.approx((10 - 2 + 39 - 3 + 49) / T)
    # escape: two 2-hour stretches at 2/3 speed, nothing lost
    assert ettr(HAND, faults, True) == pytest.approx((100 - 2 * 2 * (1 - 2 / 3)) / T)
    r = play(HAND, faults, True)
    assert (r.interruptions, r.escaped, r.degraded_hours) == (0, 2, pytest.approx(4.0))


def test_the_stall_of_each_escape_is_counted():
    p = replace(HAND, escape_stall_ms=3.6e6)  # one hour, to see it
    faults = [Fault(10.0, 0, "cable", 0, 2.0)]
    assert ettr(p, faults, True) == pytest.approx((100 - 2 / 3 - 2 * (1 - 2 / 3)) / T)


def test_a_second_fault_before_the_repair_interrupts():
    faults = [Fault(10.0, 0, "cable", 0, 8.0), Fault(11.0, 0, "optic", 1, 8.0)]
    # at 11 h: 2 h (8 -> 10) + 1 h at 2/3 speed since the checkpoint are lost; back at 12 h
    r = play(HAND, faults, True)
    assert (r.interruptions, r.overlap_interruptions, r.escaped) == (1, 1, 1)
    assert r.work_hours == pytest.approx(10 + 2 / 3 - (2 + 2 / 3) + 88)
    # the same rail twice is not a second rail
    assert play(HAND, [Fault(10.0, 0, "cable", 0, 8.0), Fault(11.0, 0, "optic", 0, 8.0)], True).interruptions == 0


def test_whole_host_faults_interrupt_both_alike():
    faults = [Fault(10.0, 0, "nic", None, 2.0), Fault(50.0, 0, "cable", None, 2.0), Fault(70.0, 0, "other")]
    expect = (10 - 2 + 39 - 3 + (70 - 51) - (19 % 4) + 29) / T
    assert ettr(HAND, faults, False) == pytest.approx(expect)
    assert ettr(HAND, faults, True) == pytest.approx(expect)
    assert play(HAND, faults, True).whole_host_interruptions == 2


def test_drain_swaps_a_degraded_host_at_the_next_checkpoint():
    p = replace(HAND, drain=True)
    # at 10 h, 2 h since the checkpoint: 2 more at 2/3 speed is 3 h: swapped at 13 h, no work
    # lost, back at 14 h (staying degraded for the 8 h repair would cost 8/3 h > the 1 h restart)
    r = play(p, [Fault(10.0, 0, "cable", 0, 8.0)], True)
    assert (r.planned_restarts, r.interruptions) == (1, 0)
    assert r.work_hours == pytest.approx(10 + 2 + 86)
    # a short repair is waited out
    r = play(p, [Fault(10.0, 0, "cable", 0, 1.0)], True)
    assert r.planned_restarts == 0 and r.work_hours == pytest.approx(100 - 1 / 3)


def test_a_fault_during_a_restart_restarts_it():
    faults = [Fault(10.0, 0, "other"), Fault(10.5, 0, "other")]
    r = play(HAND, faults, False)
    assert (r.interruptions, r.failed_restarts) == (1, 1)
    assert r.work_hours == pytest.approx(10 - 2 + 100 - 11.5)


def sim_json(*args):
    res = CliRunner().invoke(main, ["simulate", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


ZERO = ["--nic-rate", "0", "--cable-rate", "0", "--optic-rate", "0", "--other-rate", "0"]


def test_cli_zero_failures():
    d = sim_json("--gpus", "4096", "--days", "10", *ZERO)
    for mode in ("restart", "escape"):
        assert d[mode]["ettr"] == 1.0 and d[mode]["interruptions"] == 0 and d[mode]["yuan_lost"] == 0
    assert d["interruptions_avoided"] == 0


def test_cli_all_failures_whole_host():
    d = sim_json("--gpus", "16384", "--days", "54", "--whole-host-share", "1", "--trials", "5")
    assert d["faults_per_run"]["whole_host"] == d["faults_per_run"]["nic"] + d["faults_per_run"]["cable"] + \
        d["faults_per_run"]["optic"] > 0
    assert d["escape"]["ettr"] == d["restart"]["ettr"] < 1
    assert d["interruptions_avoided"] == 0 and d["escape"]["escaped_faults"] == 0


def test_cli_all_failures_single_rail():
    # only network faults, every repair 2 h, 8 rails (never all down at once), no drain: escape
    # loses only the stretches on 7 of 8 rails and the stalls; restart loses a restart per fault
    d = sim_json("--gpus", "2048", "--days", "54", "--rails", "8", "--nic-rate", "1e-4", "--cable-rate", "1e-4",
                 "--optic-rate", "0", "--other-rate", "0", "--repair-nic-hours", "2", "--repair-cable-hours", "2",
                 "--no-drain", "--comm-share", "0.5", "--trials", "10")
    T = 54 * 24.0
    e, r = d["escape"], d["restart"]
    assert e["interruptions"] == 0 and e["overlap_interruptions"] == 0 and e["escaped_faults"] > 5
    s = 1 / (0.5 + 0.5 * 8 / 7)
    assert d["degraded_speed"] == pytest.approx(s)
    expect = 1 - ((1 - s) * e["degraded_hours"] + s * e["stall_seconds"] / 3600) / T
    assert e["ettr"] == pytest.approx(expect, rel=1e-9)
    # two hosts degraded at once cost no more than one: the time degraded is at most 2 h per fault
    assert e["degraded_hours"] <= 2 * e["escaped_faults"] + 1e-9
    total = sum(d["faults_per_run"][k] for k in ("nic", "cable", "optic"))
    assert r["interruptions"] + r["failed_restarts"] == pytest.approx(total)  # every fault stops the job
    assert e["escaped_faults"] + e["absorbed_faults"] == pytest.approx(total)  # none does
    assert 1 - r["ettr"] == pytest.approx((r["lost_work_hours"] + r["restart_hours"]) / T)
    assert d["interruptions_avoided"] == r["interruptions"] > 0


def test_fault_counts_follow_the_rates():
    p = SimParams(gpus=100_000, days=54)
    import numpy as np

    rng = np.random.default_rng(1)
    n = [len([f for f in draw_faults(p, rng) if f.kind == "other"]) for _ in range(20)]
    mean = p.other_per_gpu_day * p.gpus * p.days
    assert abs(sum(n) / 20 - mean) < 4 * math.sqrt(mean / 20)
    # Llama 3's cluster (one NIC per GPU) sees its network faults: 1.7 % and 8.4 % of 419
    llama = simulate(SimParams(gpus=16384, days=54, gpus_per_host=8, rails=8, trials=40))
    fk = llama["faults_per_run"]
    assert fk["nic"] == pytest.approx(419 * 0.017, rel=0.25)
    assert fk["cable"] + fk["optic"] == pytest.approx(419 * 0.084, rel=0.15)
    assert fk["other"] == pytest.approx(419 * (1 - 0.101), rel=0.05)


def test_bad_input_is_refused():
    assert CliRunner().invoke(main, ["simulate", "--gpus", "0"]).exit_code == 2
    from linkescape.errors import UsageError

    with pytest.raises(UsageError):
        SimParams(whole_host_share=2)


def test_plot(tmp_path):
    res = CliRunner().invoke(main, ["simulate", "--trials", "2", "--plot", str(tmp_path / "sim.png")])
    assert res.exit_code == 0, res.output
    data = (tmp_path / "sim.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
