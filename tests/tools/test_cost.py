"""`linkescape cost`: the seed's scenario, the closed form against hand-computed cases, and its
agreement with `linkescape simulate` on the same inputs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.tools.cost import closed_form, compute, renewal_ettr, seed_article
from linkescape.tools.model import SimParams
from linkescape.tools.simulate import simulate


def run(*args):
    res = CliRunner().invoke(main, ["cost", *args])
    assert res.exit_code == 0, res.output
    return res.output


# ------------------------------------------------------------------ the seed article
def test_the_seed_scenario_gives_its_figure():
    d = json.loads(run("--scenario", "seed-article", "--json"))
    assert d["network_interruptions"] == pytest.approx(419 * 0.084)
    assert d["lost_card_hours"] == pytest.approx(351_960)
    assert d["lost_yuan"] == 3_519_600
    assert d["per_year_yuan"] == pytest.approx(3_519_600 * 365 / 54, abs=0.01)
    assert {c["input"] for c in d["contradictions"]} >= {"recovery_hours", "cards", "network_share"}


def test_the_seed_scenario_says_what_contradicts_its_source():
    out = run("--scenario", "seed-article")
    for text in ("419 interruptions x 0.084", "10,000 cards", "351,960", "3,519,600 yuan", "x 365 / 54 days",
                 "ETTR would be at most 68%", "0.31 h per interruption", "switch/cable", "1.7%"):
        assert text in out, (text, out)


def test_the_seed_scenario_takes_its_inputs_as_flags():
    d = json.loads(run("--scenario", "seed-article", "--recovery-hours", "0.3", "--cards", "16384", "--json"))
    assert d["lost_yuan"] == pytest.approx(419 * 0.084 * 16384 * 0.3 * 10)
    # 0.3 h fits the source's > 90 %, and 16,384 is the source's cluster: neither contradicts it
    assert {c["input"] for c in d["contradictions"]} == {"network_share", "per_year"}
    assert seed_article(interruptions=100, days=30, network_share=0.5, cards=2000, yuan_per_card_hour=3,
                        recovery_hours=2)["lost_yuan"] == 50 * 2000 * 2 * 3


# ------------------------------------------------------------------ the closed form by hand
def test_renewal_by_hand():
    # nothing interrupts: ETTR is the checkpoints' efficiency
    assert renewal_ettr(0.0, 0.0, 0.9, 1.0, 0.5)["ettr"] == 0.9
    # rare interruptions: each costs half an interval and the restart
    lam, tau, r = 1e-4, 1.0, 0.5
    got = renewal_ettr(lam, lam, 1.0, tau, r)
    assert got["lost_per_interruption"] == pytest.approx(tau / 2, rel=1e-3)
    assert 1 - got["ettr"] == pytest.approx(lam * (tau / 2 + r), rel=1e-3)


# 100 hosts x 8 GPUs x 4 rails (no cross faults, no isolation by overlap), 54 days; only NIC and switch
# faults, 10 of each per run; checkpoint every hour (free), restart 0.5 h, no wait for a path. An
# interruption then costs tau / 2 + R = 1 h of the whole cluster: 800 GPU-hours, 8,000 yuan.
PRESET = SimParams(gpus=800, rails=4, nic_per_day=10 / (400 * 54), switch_per_day=10 / (400 * 54), cable_per_day=0,
                   other_per_gpu_day=0, checkpoint_hours=1.0, checkpoint_write_s=0, restart_hours=0.5, no_path_s=0,
                   escape_stall_ms=0, trials=40)


@pytest.mark.parametrize("coverage,escaped", [("rail-optimized", 20), ("dual-plane", 10), ("tor", 10)])
def test_a_hand_computed_case_per_fabric_preset(coverage, escaped):
    p = replace(PRESET, coverage=coverage)
    assert sum(p.events_per_run().values()) == pytest.approx(20)
    cf = closed_form(p)
    # escaped faults x 1 h x 800 GPUs x 10 yuan (within the second-order terms: overlaps, faults in restarts)
    assert cf["saved"]["escape"]["yuan_saved"] == pytest.approx(escaped * 8000, rel=0.03)
    assert cf["saved"]["escape"]["interruptions_avoided"] == pytest.approx(escaped, rel=0.03)
    # the same preset, played: the faults that take every rail are the preset's
    mc = simulate(p)
    assert mc["escape"]["interruptions_by_cause"]["isolated"] == pytest.approx(20 - escaped, abs=2.5)
    lo, hi = mc["saved"]["escape"]["yuan_saved_ci"]
    assert lo <= cf["saved"]["escape"]["yuan_saved"] <= hi


def test_the_coverage_band_and_the_conservative_default():
    d = json.loads(run("--json"))
    band = d["coverage_band"]
    assert band["rail-optimized"] > band["dual-plane"] > band["tor"]
    assert d["inputs"]["coverage"] == "tor" and d["yuan_saved"] == pytest.approx(band["tor"])
    # what the restart costs per interruption fits the source's > 90 % ETTR
    assert d["hours_per_interruption"] <= 0.31 and d["restart"]["ettr"] > 0.90


def test_the_rates_uncertainty_is_carried_through():
    res = compute(SimParams(coverage="rail-optimized"))
    rb = res["rate_band"]
    lo, hi = rb["nic_interval"]
    assert lo < 0.5 and hi > 1.9  # 7 events: about a 2x interval each way
    assert rb["lo"] < res["yuan_saved"] < rb["hi"]
    assert rb["nic_low"] < res["yuan_saved"] < rb["nic_high"]


def test_the_policies_as_built():
    p = SimParams(rails=2, coverage="rail-optimized", drain=False, no_path_s=0, relay=False)
    ab = closed_form(p)["escape"]
    stripe = closed_form(replace(p, policy="stripe", stripe_fault_rate=0.5))["escape"]
    assert ab["degraded_hours"] == 0  # active-backup at its measured 1.00x: nothing slower
    assert stripe["ettr"] < ab["ettr"] and stripe["degraded_hours"] > 0
    # cross faults: the relay turns their interruptions into relayed hours
    relay = closed_form(replace(p, relay=True))["escape"]
    assert relay["interruptions"] < ab["interruptions"] and relay["relayed_hours"] > 0


@pytest.mark.parametrize("args", [["--coverage", "rail-optimized"], ["--rails", "2", "--relay"],
                                  ["--policy", "stripe", "--rails", "2", "--no-path-seconds", "60"]])
def test_cost_and_simulate_agree_on_the_same_inputs(args):
    c = json.loads(run(*args, "--json"))
    res = CliRunner().invoke(main, ["simulate", *args, "--trials", "300", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    lo, hi = s["saved"]["escape"]["yuan_saved_ci"]
    assert lo <= c["yuan_saved"] <= hi, (c["yuan_saved"], lo, hi)
    for mode in ("restart", "escape"):
        a, b = s[mode]["ettr_ci"]
        assert a - 2e-4 <= c[mode]["ettr"] <= b + 2e-4, (mode, c[mode]["ettr"], a, b)


def test_every_input_is_a_flag():
    d = json.loads(run("--interruptions", "100", "--days", "30", "--network-share", "0.5", "--nic-share", "0",
                       "--cards", "2000", "--yuan-per-card-hour", "3", "--recovery-hours", "2", "--json"))
    assert d["network_interruptions"] == pytest.approx(50)
    assert d["inputs"]["restart_hours"] == 2 and d["inputs"]["gpus"] == 2000
    assert d["resolved"]["events_per_run"]["other"] == pytest.approx(50)


@pytest.mark.parametrize("args", [["--network-share", "1.5"], ["--days", "0"], ["--cards", "-1"],
                                  ["--scenario", "nope"]])
def test_bad_input_is_refused(args):
    assert CliRunner().invoke(main, ["cost", *args]).exit_code == 2


def test_bad_input_is_a_typed_error_in_python():
    from linkescape.errors import UsageError

    with pytest.raises(UsageError):
        SimParams(network_share=2)
    with pytest.raises(UsageError):
        SimParams(coverage="mesh")
    assert math.isfinite(closed_form(SimParams(gpus=8))["escape"]["ettr"])
