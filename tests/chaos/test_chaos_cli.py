"""``linkescape chaos`` options, the printed schedule, and replaying one (no root needed)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from linkescape.chaos.cli import chaos, parse_duration
from linkescape.cli import main
from linkescape.faults import Schedule


def test_durations():
    assert parse_duration("60s") == 60 and parse_duration("10m") == 600 and parse_duration("1h") == 3600
    assert parse_duration("500ms") == 0.5 and parse_duration("90") == 90
    for bad in ("", "10x", "-5s", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_schedule_only_prints_the_seed_and_plan_reproducibly(tmp_path):
    runner = CliRunner()
    out1 = runner.invoke(main, ["chaos", "--schedule-only", "--duration", "60s", "--seed", "42",
                                "--json", str(tmp_path / "s.json")])
    out2 = runner.invoke(main, ["chaos", "--schedule-only", "--duration", "1m", "--seed", "42"])
    assert out1.exit_code == 0, out1.output
    assert out1.output == out2.output
    assert out1.output.startswith("seed 42: ")
    sched = Schedule.load(str(tmp_path / "s.json"))
    assert sched.seed == 42 and sched.duration == 60 and len(out1.output.splitlines()) == len(sched.faults) + 1


def test_a_saved_schedule_replays_and_a_window_cuts_it(tmp_path):
    runner = CliRunner()
    runner.invoke(chaos, ["--schedule-only", "--duration", "2m", "--seed", "7", "--json", str(tmp_path / "a.json")])
    again = runner.invoke(chaos, ["--schedule-only", "--schedule", str(tmp_path / "a.json")])
    first = runner.invoke(chaos, ["--schedule-only", "--duration", "2m", "--seed", "7"])
    assert again.output == first.output
    win = runner.invoke(chaos, ["--schedule-only", "--schedule", str(tmp_path / "a.json"), "--window", "30:40",
                                "--json", str(tmp_path / "w.json")])
    assert win.exit_code == 0, win.output
    w = json.loads((tmp_path / "w.json").read_text())
    assert w["params"]["window"] == [30.0, 40.0] and all(0 <= f["at"] < 10 for f in w["faults"])


def test_bad_options_are_usage_errors(tmp_path):
    runner = CliRunner()
    assert runner.invoke(chaos, ["--schedule-only", "--kinds", "melt"]).exit_code == 2
    assert runner.invoke(chaos, ["--schedule-only", "--duration", "soon"]).exit_code == 2
    other = tmp_path / "x.json"
    runner.invoke(chaos, ["--schedule-only", "--hosts", "3", "--duration", "30s", "--seed", "1", "--json", str(other)])
    res = runner.invoke(chaos, ["--schedule-only", "--schedule", str(other), "--hosts", "4"])
    assert res.exit_code == 2 and "3 hosts" in res.output


def test_hold_sets_how_long_single_faults_last(tmp_path):
    runner = CliRunner()
    res = runner.invoke(chaos, ["--schedule-only", "--duration", "2m", "--seed", "3", "--hold", "300ms:1.2s",
                                "--kinds", "cut,blackhole,lossy", "--json", str(tmp_path / "h.json")])
    assert res.exit_code == 0, res.output
    sched = json.loads((tmp_path / "h.json").read_text())
    holds = [f["hold"] for f in sched["faults"]]
    assert holds and all(0.3 <= h <= 1.2 for h in holds)
    assert sched["params"]["hold"] == [0.3, 1.2]
    for bad in ("3s", "2s:1s", "0:1s"):
        assert runner.invoke(chaos, ["--schedule-only", "--hold", bad]).exit_code == 2


def test_chaos_needs_root(monkeypatch):
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = CliRunner().invoke(chaos, ["--duration", "5s", "--seed", "1"])
    assert res.exit_code == 1 and "root" in res.output


def test_live_view_renders_faults_verified_and_the_current_stall():
    import io
    import time

    from rich.console import Console

    from linkescape.chaos.live import LiveView
    from linkescape.chaos.ranks import RankState

    now = time.time()
    states = [RankState(0, 0, ready=True, progress={"steps": 10, "verified": 30, "wrong": 0, "step": 10,
                                                      "since": now - 2.5}),
              RankState(1, 1, ready=True, progress={"steps": 11, "verified": 31, "wrong": 0, "step": None,
                                                      "since": None, "last_done": now})]
    lines = []
    view = LiveView(seed=9, duration=60, live=False, say=lines.append)
    view.update(5.0, states, ["#3 cut h1r0 at 4.00s for 2.00s"], 2)
    assert lines and "verified 61" in lines[0] and "current stall 2.5" in lines[0]
    out = io.StringIO()
    Console(file=out, width=120).print(LiveView(seed=9, duration=60, live=False)._render(5.0, states, ["#3 cut"], 2))
    text = out.getvalue()
    assert "seed 9" in text and "#3 cut" in text and "61 operations" in text and "outstanding 2." in text


def test_cross_hold_makes_crosses_outlast_the_no_path_deadline(tmp_path):
    runner = CliRunner()
    res = runner.invoke(chaos, ["--schedule-only", "--duration", "5m", "--seed", "4", "--cross-hold", "20s:30s",
                                "--interval", "2s", "--max-active", "2", "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    sched = Schedule.load(str(tmp_path / "c.json"))
    crosses = [f for f in sched.faults if f.kind == "cross"]
    assert crosses and all(20.0 <= f.hold <= 30.0 for f in crosses)
    assert sched.params["cross_hold"] == [20.0, 30.0]
    for a in crosses:  # never two at once: no host would have every rail to relay either pair
        assert not [b for b in crosses if b is not a and b.at <= a.at < b.end]
    line = next(x for x in res.output.splitlines() if x.startswith("no-path deadline"))
    deadline = float(line.split()[2])
    assert deadline < 20.0 and f"{len(crosses)} of {len(crosses)} cross faults last longer" in line
    same = runner.invoke(chaos, ["--schedule-only", "--duration", "5m", "--seed", "4", "--interval", "2s",
                                 "--max-active", "2", "--no-path-timeout", "25s", "--cross-hold", "20s:30s"])
    assert "no-path deadline 25 s" in same.output
    for bad in ("0s", "30s:20s", "soon"):
        assert runner.invoke(chaos, ["--schedule-only", "--cross-hold", bad]).exit_code == 2


def test_both_policies_in_turn_for_long_runs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(chaos, ["--schedule-only", "--duration", "20m", "--seed", "9", "--json",
                                str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    sched = Schedule.load(str(tmp_path / "b.json"))
    parts = sched.params["parts"]
    assert [p["policy"] for p in parts] == ["active-backup", "stripe"]  # auto: both from 10 min on
    assert parts[0]["from"] == 0 and parts[0]["to"] == parts[1]["from"] == 600 and parts[1]["to"] == 1200
    assert parts[0]["seed"] == 9 and parts[1]["seed"] == 10
    for p in parts:  # no fault crosses a part's end: the ranks are restarted there
        inside = [f for f in sched.faults if p["from"] <= f.at < p["to"]]
        assert inside and all(f.end <= p["to"] - 3.0 + 1e-9 for f in inside)
    assert "parts: active-backup from 0 s to 600 s" in res.output
    one = runner.invoke(chaos, ["--schedule-only", "--duration", "20m", "--seed", "9", "--policy", "stripe",
                                "--json", str(tmp_path / "s.json")])
    assert one.exit_code == 0 and "parts" not in Schedule.load(str(tmp_path / "s.json")).params
    short = runner.invoke(chaos, ["--schedule-only", "--duration", "2m", "--seed", "9", "--policy", "both",
                                  "--json", str(tmp_path / "short.json")])
    assert [p["policy"] for p in Schedule.load(str(tmp_path / "short.json")).params["parts"]] == [
        "active-backup", "stripe"]
    # a plan of one part cannot be played under both policies
    bad = runner.invoke(chaos, ["--schedule-only", "--schedule", str(tmp_path / "s.json"), "--policy", "both"])
    assert bad.exit_code == 2 and "two parts" in bad.output
    # a replayed plan in parts keeps them; a window cuts them too
    win = runner.invoke(chaos, ["--schedule-only", "--schedule", str(tmp_path / "b.json"), "--window", "500:700",
                                "--json", str(tmp_path / "w.json")])
    assert win.exit_code == 0, win.output
    w = Schedule.load(str(tmp_path / "w.json"))
    assert [(p["policy"], p["from"]) for p in w.params["parts"]] == [("active-backup", 0.0), ("stripe", 100.0)]


def test_a_run_directory_holding_an_earlier_run_is_refused_and_kept(tmp_path):
    """A second run into the same --out read the first one's store (handshakes against its secret failed
    at set-up: UnverifiedReject, PeerLost) and appended to its operation trails; now it is a usage error
    and the earlier run is left as it was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "store").write_text("an earlier job's store")
    (out / "ops-0.jsonl").write_text("{}\n")
    res = CliRunner().invoke(chaos, ["--duration", "5s", "--seed", "1", "--out", str(out)])
    assert res.exit_code == 2 and "holds an earlier run" in res.output and "store" in res.output
    assert (out / "store").read_text() == "an earlier job's store" and (out / "ops-0.jsonl").read_text() == "{}\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    from linkescape.chaos.cli import _earlier_run
    assert _earlier_run(str(empty)) == [] and _earlier_run(str(tmp_path / "absent")) == []


def test_sigterm_stops_the_ranks_and_takes_the_testbed_down(tmp_path):
    """``kill`` (SIGTERM) on a running soak ends it as Ctrl-C does: its ranks stopped, its testbed's
    namespaces, veths and bridges gone (they and the ranks used to stay)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from linkescape.testbed.netns import down, find_leftovers, list_netns
    from linkescape.testbed.pytest_fixtures import require_testbed

    require_testbed()
    before = set(list_netns())
    proc = subprocess.Popen([sys.executable, "-c", "from linkescape.cli import main; main()", "chaos", "--duration",
                             "60s", "--seed", "5", "--out", str(tmp_path / "run"), "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    names = set()
    try:
        for line in proc.stdout:
            if line.lstrip().startswith("["):  # its ranks are up and the plan is playing
                break
        names = {n.rsplit("-h", 1)[0] for n in set(list_netns()) - before if n.startswith("ch")}
        assert names and all(find_leftovers(n) for n in names), names
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode != 0
        assert not any(find_leftovers(n) for n in names), [find_leftovers(n) for n in names]
        ranks = subprocess.run(["pgrep", "-f", f"chaos.worker .*--ops {tmp_path}"], capture_output=True, text=True)
        assert ranks.stdout.strip() == "", ranks.stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for n in names:
            if find_leftovers(n):
                down(n)
