"""`linkescape report`: the faults of an event trail, one row each, and the timeline picture."""

from __future__ import annotations

import glob
import json
import os
import time

import numpy as np
from click.testing import CliRunner

from linkescape import Config
from linkescape.cli import main
from linkescape.testing import raise_first, run_ranks
from linkescape.tools.report import build, read_trails
from linkescape.tools.timeline import infer_faults

RAILS = ("127.0.0.1", "127.0.0.2")


def ev(ts, rank, event, peer, rail, cause=None, **extra):
    return {"ts": ts, "rank": rank, "event": event, "peer": peer, "rail": rail, "cause": cause, **extra}


def cut_trail(host, rail, t, ranks=3, back=1.0, holddown=1.0):
    """What the ranks write when host's rail is cut at t and repaired at t + back."""
    out = []
    for p in range(ranks):
        if p == host:
            continue
        out += [ev(t + 0.0002, host, "link_down", p, rail, "carrier"),
                ev(t + 0.0003, host, "failover", p, 1 - rail, "carrier", from_rail=rail),
                ev(t + 0.0010, p, "link_down", host, rail, "peer_carrier"),
                ev(t + 0.0011, p, "failover", host, 1 - rail, "peer_carrier", from_rail=rail),
                ev(t + back, host, "link_up", p, rail), ev(t + back + 0.001, p, "link_up", host, rail),
                ev(t + back + holddown, host, "failback", p, rail, from_rail=1 - rail),
                ev(t + back + holddown + 0.002, p, "failback", host, rail, from_rail=1 - rail)]
    return sorted(out, key=lambda e: e["ts"])


def test_faults_are_found_with_their_host_and_times():
    trail = cut_trail(0, 0, 100.0) + cut_trail(2, 1, 110.0, back=3.0) + [
        ev(130.0, 1, "link_down", 2, 0, "timeout"), ev(130.001, 1, "failover", 2, 1, "timeout", from_rail=0),
        ev(130.02, 2, "link_down", 1, 0, "timeout"), ev(130.021, 2, "failover", 1, 1, "timeout", from_rail=0)]
    rep = build(sorted(trail, key=lambda e: e["ts"]))
    assert [r["fault"] for r in rep["faults"]] == ["carrier h0 r0", "carrier h2 r1", "silent h1/2 r0"]
    a, b, c = rep["faults"]
    assert a["detected_s"] == 0.0 and a["detected_by"]["rank"] == 0 and a["detected_by"]["cause"] == "carrier"
    assert abs(a["failover_ms"] - 0.1) < 1e-6 and abs(a["all_failed_over_ms"] - 0.9) < 1e-6
    assert abs(a["down_ms"] - 1000.8) < 1e-6        # detection to the last link back up
    assert abs(a["failback_ms"] - 999.0) < 1e-6     # first failback after the rail was back
    assert (a["failovers"], a["failbacks"]) == (4, 4)
    assert b["host"] == 2 and abs(b["down_ms"] - 3000.8) < 1e-6 and abs(b["detected_s"] - 10.0) < 1e-9
    assert c["host"] is None and c["back_on_rail_s"] is None and c["failback_ms"] is None


def test_a_flap_is_one_fault():
    first = [e for e in cut_trail(1, 0, 10.0, ranks=2, back=0.3) if e["event"] != "failback"]  # down again first
    trail = first + cut_trail(1, 0, 11.0, ranks=2, back=0.3)
    faults = infer_faults(trail)
    assert len(faults) == 1 and faults[0]["kind"] == "flap" and faults[0]["host"] == 1
    assert [s for _, s in faults[0]["transitions"]] == ["down", "up", "down", "up"]


def _job(comm):
    buf = np.ones(1 << 16, np.float32)
    for _ in range(3):
        comm.all_reduce(buf)
    if comm.rank == 1:
        comm.inject_fault(0, "cut")
    for _ in range(5):
        comm.all_reduce(buf)
    comm.barrier()
    if comm.rank == 1:
        comm.inject_fault(0, "restore")
    deadline = time.monotonic() + 10
    flag = np.zeros(1, np.int32)
    while True:  # until every rank is back on rail 0 (decided together)
        comm.all_reduce(buf)
        snap = comm.snapshot()
        flag[0] = 0 if all(p["primary"] == 0 for p in snap["peers"].values()) or time.monotonic() > deadline else 1
        comm.all_reduce(flag, )
        if flag[0] == 0:
            break
    return True


def test_report_of_a_real_trail(tmp_path):
    events = str(tmp_path / "events-{rank}.jsonl")
    cfg = Config(failback_holddown=0.3, timeout=30, events=events)
    raise_first(run_ranks(3, _job, rails=RAILS, config=cfg, timeout=60))
    files = sorted(glob.glob(str(tmp_path / "events-*.jsonl")))
    assert len(files) == 3
    png = str(tmp_path / "timeline.png")
    res = CliRunner().invoke(main, ["report", *files, "--png", png, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert [r["fault"] for r in rep["faults"]] == ["carrier h1 r0"], rep["faults"]
    row = rep["faults"][0]
    assert row["failover_ms"] is not None and row["failover_ms"] < 1000
    assert row["down_ms"] > 0 and row["failback_ms"] is not None and row["failbacks"] >= 1
    assert rep["ranks"] == 3 and rep["rails"] == 2
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 20_000
    # the table, from a directory of trails
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 0 and "carrier h1 r0" in res.output and "failover after" in res.output
    assert read_trails([str(tmp_path / "events-*.jsonl")])


def test_no_trail_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 1 and "no event trail" in res.output


# ------------------------------------------------------------------ relays
def relay_trail(t, via=3, back=5.0):
    """Hosts 1 and 2 lose rails 0 and 1 at t: no rail in common, relayed through ``via``, back at t + back."""
    return [ev(t, 1, "link_down", 2, 1, "peer_carrier"), ev(t + 0.001, 1, "no_path", 2, 1, "peer_carrier"),
            ev(t + 0.001, 2, "no_path", 1, 0, "carrier"),
            ev(t + 0.03, 1, "relay_on", 2, -1, via=via), ev(t + 0.04, 2, "relay_on", 1, -1, via=via),
            ev(t + back, 1, "relay_off", 2, -1, "path_back", via=via, bytes=1000),
            ev(t + back + 0.01, 2, "relay_off", 1, -1, "path_back", via=via, bytes=3000)]


def test_relayed_pairs_are_rows_with_their_via_and_the_lanes_count_them():
    from linkescape.tools.timeline import relay_intervals, relay_pairs, routed_lanes

    trail = sorted(cut_trail(0, 0, 100.0, ranks=4) + relay_trail(110.0), key=lambda e: e["ts"])
    rep = build(trail)
    (row,) = rep["relays"]
    assert row["pair"] == [1, 2] and row["via"] == [3] and row["causes"] == ["path_back"]
    assert abs(row["on_s"] - 10.03) < 1e-3 and abs(row["off_s"] - 15.01) < 1e-3 and row["bytes"] == 4000  # from t0
    assert abs(row["seconds"] - 4.98) < 1e-6 and row["relays"] == 2
    assert [(r["rank"], r["peer"], r["via"]) for r in rep["relay_intervals"]] == [(1, 2, 3), (2, 1, 3)]
    # still relayed at the end of the trail: no off, counted to the end
    open_ = relay_pairs(relay_intervals(relay_trail(0.0)[:5], t_end=10.0), t_end=10.0)
    assert open_[0]["t_off"] is None and abs(open_[0]["seconds"] - 9.97) < 1e-6
    lanes = routed_lanes(sorted(relay_trail(10.0), key=lambda e: e["ts"]), 4, 2, 0.0, 20.0)
    h1 = {label: (xs, ys) for label, xs, ys in lanes[1]["series"]}
    assert "via a relay" in h1 and "via a relay" not in {s[0] for s in lanes[0]["series"]}
    xs, ys = h1["via a relay"]
    assert max(ys) == 1 and ys[-1] == 0  # one peer through the relay, then back
    assert max(h1["rail 0"][1]) == 3 and min(h1["rail 0"][1]) == 2  # peer 2 left rail 0 and came back


def _cross_job(comm):
    buf = np.ones(1 << 16, np.float32)
    for _ in range(3):
        comm.all_reduce(buf)
    comm.barrier()
    if comm.rank in (1, 2):
        comm.inject_fault(comm.rank - 1, "cut")  # rank 1 loses rail 0, rank 2 rail 1
    for _ in range(20):
        comm.all_reduce(buf)
    comm.barrier()
    if comm.rank in (1, 2):
        comm.inject_fault(comm.rank - 1, "restore")
    deadline = time.monotonic() + 15
    flag = np.zeros(1, np.int32)
    while True:  # until the pair is direct again everywhere (decided together)
        comm.all_reduce(buf)
        snap = comm.snapshot()
        flag[0] = 0 if all(p["via"] is None for p in snap["peers"].values()) or time.monotonic() > deadline else 1
        comm.all_reduce(flag)
        if flag[0] == 0:
            break
    return True


def test_report_of_a_real_trail_with_a_relay(tmp_path):
    events = str(tmp_path / "events-{rank}.jsonl")
    cfg = Config(failback_holddown=0.3, timeout=60, events=events)
    raise_first(run_ranks(4, _cross_job, rails=RAILS, config=cfg, timeout=120))
    png = str(tmp_path / "timeline.png")
    res = CliRunner().invoke(main, ["report", str(tmp_path), "--png", png, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    pairs = [r for r in rep["relays"] if r["pair"] == [1, 2]]
    assert pairs and pairs[0]["via"] and set(pairs[0]["via"]) <= {0, 3}, rep["relays"]
    assert pairs[-1]["off_s"] is not None and "path_back" in pairs[-1]["causes"]
    assert rep["events_by_kind"]["relay_on"] >= 2
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 20_000
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 0 and "relayed pair" in res.output and "h1 - h2" in res.output, res.output
    assert "path_back" in res.output
