"""The chaos soak on a real testbed: every operation checked exactly under overlapping faults.

``test_chaos_soak_60s`` is the issue-7 gate in ``make test``: 60 s of random
overlapping faults of every kind, then the verdict of the report (no wrong
result, no error, no hang, every stall within its bound + the run's own
noise, see docs/failover.md "Stalls and their bounds"). When it fails its
report says why, and its run directory is kept under /tmp.
"""

from __future__ import annotations

import json
import os

import pytest

from linkescape.chaos import ChaosOptions, run_chaos
from linkescape.chaos import workload
from linkescape.chaos.report import format_report
from linkescape.faults import scripted
from linkescape.testbed.pytest_fixtures import require_nft, require_testbed

pytestmark = pytest.mark.testbed


def _run(**kw):
    require_testbed()
    require_nft()
    rep = run_chaos(ChaosOptions(live=False, **kw), say=lambda _line: None)
    return rep, format_report(rep)


def test_a_short_scripted_run_reports_everything(tmp_path):
    plan = scripted([{"kind": "cut", "host": 1, "rail": 0, "at": 3.0, "hold": 1.5},
                     {"kind": "lossy", "host": 2, "rail": 1, "at": 5.0, "hold": 1.5, "loss": 10},
                     {"kind": "isolate", "targets": [[3, 0], [3, 1]], "at": 8.0, "hold": 1.0, "mode": "cut"}],
                    hosts=4, rails=2, duration=14)
    rep, text = _run(duration=14, seed=3, schedule=plan, out=str(tmp_path / "run"),
                     json_path=str(tmp_path / "rep.json"))
    assert rep["wrong"]["elements"] == 0 and not rep["errors"] and not rep["hung"], text
    assert rep["faults"]["applied"] == {"cut": 1, "lossy": 1, "isolate": 1}
    ops = rep["operations"]["verified_by_kind"]
    assert set(ops) == set(workload.OPERATIONS) and rep["operations"]["verified"] > 200, ops
    assert rep["detection"]["cut"]["local"]["n"] == 1  # the cut was seen on its rail
    assert rep["stalls"]["longest"] is not None and "by_condition" in rep["stalls"]
    for rank in range(4):
        assert set(rep["resources"][rank]) >= {"start", "warm", "end", "closed"}
    run_dir = tmp_path / "run"
    for name in ("schedule.json", "faults.jsonl", "run.json", "report.json", "ops-0.jsonl", "events-0.jsonl"):
        assert (run_dir / name).exists(), name
    assert json.loads((tmp_path / "rep.json").read_text())["seed"] == rep["seed"]
    # every step says whom it waits for; the stop flag's all_reduce after every 4th step is a step too
    recs = [json.loads(line) for line in (run_dir / "ops-0.jsonl").read_text().splitlines()]
    assert all(r["waits"] for r in recs) and any(r["kind"] == "stop" for r in recs)
    assert rep["operations"]["steps_per_rank"][0] == sum(1 for r in recs if r["kind"] != "stop")
    assert "faults by kind" in text and ("PASS" in text or "FAIL" in text)


def test_chaos_soak_60s():
    """60 s, seed 1, every fault kind: exit 0 only if nothing was wrong, failed, hung or stalled past its bound."""
    out = f"/tmp/linkescape-chaos-test-s1-{os.getpid()}"
    rep, text = _run(duration=60, seed=1, out=out)
    assert rep["faults"]["total_applied"] >= 30
    assert rep["exit_code"] == 0, text


def test_crosses_longer_than_the_no_path_deadline_are_relayed_under_both_policies(tmp_path):
    """Two parts (new ranks under active-backup, then stripe, on one testbed), each with a cross held 7 s
    while the ranks' no-path deadline is 4 s: only a relay lets the pair go on. Every result checked, the
    relays counted and timed, every rank's resources sampled over time, the RSS picture drawn."""
    from linkescape.faults import concatenate

    one = scripted([{"kind": "cross", "targets": [[1, 0], [2, 1]], "at": 2.5, "hold": 7.0, "mode": "cut"},
                    {"kind": "cut", "host": 3, "rail": 0, "at": 10.0, "hold": 0.5}], hosts=4, rails=2,
                   duration=13.5)
    two = scripted([{"kind": "cross", "targets": [[0, 1], [3, 0]], "at": 2.5, "hold": 7.0, "mode": "blackhole"}],
                   hosts=4, rails=2, duration=12.5)
    plan = concatenate([(one, {"policy": "active-backup"}), (two, {"policy": "stripe"})])
    rep, text = _run(duration=plan.duration, seed=4, schedule=plan, out=str(tmp_path / "run"), no_path_timeout=4.0,
                     resource_interval=1.0)
    assert rep["wrong"]["elements"] == 0 and not rep["errors"] and not rep["hung"], text  # no LinkFailure
    assert [p["policy"] for p in rep["parts"]] == ["active-backup", "stripe"], rep["parts"]
    assert rep["config"]["policies"] == ["active-backup", "stripe"] and rep["config"]["no_path_timeout_s"] == 4.0
    assert all(p["operations_verified"] > 100 for p in rep["parts"]), rep["parts"]
    assert rep["no_path"]["crosses"] == 2 and rep["no_path"]["crosses_longer"] == 2
    rel = rep["relays"]
    assert rel["relay_on"] >= 4 and rel["relay_off"].get("path_back", 0) >= 2, text
    assert rel["pairs"] == 2 and rel["relayed_s"] >= 10.0, rel  # (1, 2) and (0, 3), most of their 7 s each
    assert [s["relay_possible"] for s in rel["cross_samples"]] == [True, True]
    assert all(s["relay_on_s"] is not None and s["relay_on_s"] < 1.5 for s in rel["cross_samples"]), rel
    assert rep["stalls"]["by_condition"].get("relayable", {}).get("steps", 0) > 50, rep["stalls"]["by_condition"]
    tr = rep["resource_trends"]
    assert [p["part"] for p in tr["parts"]] == [1, 2] and tr["flat"] is None  # short parts: not judged
    assert all(len(p["ranks"]) == 4 and p["ranks"][0]["samples"] >= 8 for p in tr["parts"]), tr
    assert (tmp_path / "run" / "rss.png").stat().st_size > 20000 and rep["rss_png"]
    assert (tmp_path / "run" / "part-1" / "stderr-0.txt").exists() and (tmp_path / "run" / "part-2").is_dir()
    assert "relays: relay_on" in text and "part 2: policy stripe" in text
    assert rep["exit_code"] == 0, text
