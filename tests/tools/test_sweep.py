"""`linkescape simulate --sweep` and `--trials`: the savings across an input, and intervals that
narrow as the paired Monte Carlo runs more trials."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.errors import UsageError
from linkescape.tools import sweep
from linkescape.tools.model import SimParams
from linkescape.tools.simulate import simulate


def sim(*args):
    res = CliRunner().invoke(main, ["simulate", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_parse():
    assert sweep.parse("checkpoint-hours=0.1:0.5:5") == ("checkpoint_hours", pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5]))
    assert sweep.parse("interval=1:2") [0] == "checkpoint_hours"
    assert sweep.parse("restart-time=0.1:0.3:3")[0] == "restart_hours"
    assert sweep.parse("network-share-of-step=0:1:3") == ("comm_share", [0.0, 0.5, 1.0])
    assert sweep.parse("coverage=all")[1] == ["rail-optimized", "dual-plane", "tor"]
    assert sweep.parse("coverage=tor:rail-optimized")[1] == ["tor", "rail-optimized"]
    assert sweep.parse("gpus=1000:100000:3") == ("gpus", [1000, 10000, 100000])
    assert sweep.parse("rails=2:8:4") == ("rails", [2, 4, 6, 8])
    for bad in ("checkpoint-hours", "nope=1:2", "coverage=mesh", "restart-hours=a:b", "restart-hours=1:2:0"):
        with pytest.raises(UsageError):
            sweep.parse(bad)


def test_a_sweep_prints_and_plots(tmp_path):
    png = tmp_path / "sweep.png"
    out = sim("--sweep", "checkpoint-hours=0.1:0.9:3", "--trials", "4", "--gpus", "2048", "--plot", str(png))
    lines = out.splitlines()
    assert lines[0].split()[0] == "checkpoint-hours" and len(lines) == 1 + 3 + 1
    assert [ln.split()[0] for ln in lines[1:4]] == ["0.1", "0.5", "0.9"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_follows_the_input():
    rows = json.loads(sim("--sweep", "restart-hours=0.1:1:3", "--coverage", "rail-optimized", "--trials", "20",
                          "--json"))["sweep"]
    # a dearer restart makes each escaped fault worth more, in both views
    assert rows[0]["closed_form"] < rows[1]["closed_form"] < rows[2]["closed_form"]
    assert rows[0]["saved"] < rows[2]["saved"]
    cov = json.loads(sim("--sweep", "coverage=all", "--trials", "20", "--json"))["sweep"]
    assert [r["value"] for r in cov] == ["rail-optimized", "dual-plane", "tor"]
    assert cov[0]["closed_form"] > cov[1]["closed_form"] > cov[2]["closed_form"]


def test_a_sweep_over_a_replayed_log(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("cause,start,repair,host,rail\ncable,10,2,0,0\nother,50,0,1,\n")
    rows = json.loads(sim("--failure-log", str(path), "--sweep", "checkpoint-hours=1:4:2", "--json"))["sweep"]
    assert [r["trials"] for r in rows] == [1, 1] and rows[0]["saved"] != rows[1]["saved"]


def test_the_paired_interval_narrows_with_trials():
    p = SimParams(gpus=4096, coverage="rail-optimized", rails=2, seed=3)

    def width(trials):
        s = simulate(replace(p, trials=trials))["saved"]["escape"]
        return s["yuan_saved_ci"][1] - s["yuan_saved_ci"][0], s

    w10, _ = width(10)
    w160, s160 = width(160)
    assert w160 < w10 / 2.5  # about 1 / sqrt(16)
    # pairing: the interval of the difference is narrower than two independent ones would give
    res = simulate(replace(p, trials=160))
    scale = p.gpus * p.hours * p.yuan_per_gpu_hour
    unpaired = 1.96 * math.hypot(res["restart"]["ettr_sd"], res["escape"]["ettr_sd"]) / math.sqrt(160) * scale * 2
    assert w160 < unpaired / 2


def test_trials_and_seed_are_flags():
    a = json.loads(sim("--trials", "3", "--seed", "1", "--gpus", "2048", "--json"))
    b = json.loads(sim("--trials", "3", "--seed", "2", "--gpus", "2048", "--json"))
    assert a["trials"] == 3 and a["restart"]["ettr"] != b["restart"]["ettr"]
    assert a["closed_form"]["yuan_saved"] == b["closed_form"]["yuan_saved"]
