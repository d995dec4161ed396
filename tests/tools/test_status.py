"""`linkescape status`: the live view, read from real ranks' metrics endpoints."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from linkescape import Config
from linkescape.cli import main
from linkescape.errors import UsageError
from linkescape.testing import run_ranks
from linkescape.tools.status import Poller, Target, parse_targets, render

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "observe"))  # (its helpers live there)
from test_metrics_server import free_base  # noqa: E402

RAILS = ("127.0.0.1", "127.0.0.2")


def _busy(comm, stop, cut):
    """all_reduce until the stop file appears; rank 1 cuts its rail 0 when the cut file appears."""
    buf = np.ones(1 << 17, np.float32)
    flag = np.zeros(2, np.int32)
    cut_done = False
    while True:
        comm.all_reduce(buf)
        if comm.rank == 0:
            flag[0] = 1 if os.path.exists(stop) else 0
            flag[1] = 1 if os.path.exists(cut) else 0
        comm.broadcast(flag, 0)
        if flag[1] and not cut_done and comm.rank == 1:
            comm.inject_fault(0, "cut")
        cut_done = cut_done or bool(flag[1])
        if flag[0]:
            return True
        time.sleep(0.01)


def _start_ranks(n, fn, *args, config, out):
    """run_ranks in a thread; returns it once all n ranks are forked. Poll
    only after that: a fork while this thread is inside getaddrinfo (urllib)
    leaves the child with glibc's resolver lock held, and the rank hangs at
    its first lookup (CI saw rank 1 of the relay test hang so)."""
    t = threading.Thread(target=lambda: out.setdefault("res", run_ranks(n, fn, *args, rails=RAILS, config=config,
                                                                        timeout=120)))
    t.start()
    deadline = time.monotonic() + 30
    while len(multiprocessing.active_children()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(multiprocessing.active_children()) >= n, "the ranks were not forked within 30 s"
    return t


@pytest.fixture
def job(tmp_path):
    base = free_base(2)
    stop, cut = str(tmp_path / "stop"), str(tmp_path / "cut")
    cfg = Config(metrics_port=base, timeout=60)
    out = {}
    t = _start_ranks(2, _busy, stop, cut, config=cfg, out=out)
    poller = Poller([Target("127.0.0.1", base), Target("127.0.0.1", base + 1)])
    deadline = time.monotonic() + 60
    while len(poller.poll()["ranks"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        yield base, cut
    finally:
        open(stop, "w").close()
        t.join(120)
    assert out.get("res") == [True, True], out


def _text(renderable) -> str:
    from rich.console import Console

    c = Console(width=200, record=True, file=open(os.devnull, "w"))
    c.print(renderable)
    return c.export_text()


def test_view_of_two_ranks_follows_a_cut(job):
    base, cut = job
    poller = Poller([Target("127.0.0.1", base), Target("127.0.0.1", base + 1)])
    poller.poll()
    time.sleep(0.5)
    view = poller.poll()
    assert [m["rank"] for m in view["ranks"]] == [0, 1] and not view["errors"]
    link = view["ranks"][0]["links"][(1, 0)]
    assert link["state"] == "up" and link["up"] == 1 and link["tx_rate"] > 0
    assert view["ranks"][0]["primary"] == {1: 0}
    text = _text(render(view))
    assert "*primary" in text and "rail 0 (lo)" in text, text
    assert "no link events" in text, text
    open(cut, "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = poller.poll()
        if view["ranks"][1]["primary"].get(0) == 1 and view["ranks"][0]["links"][(1, 0)]["state"] == "down":
            break
        time.sleep(0.2)
    assert view["ranks"][1]["links"][(0, 0)]["state"] == "down"
    assert view["ranks"][1]["primary"] == {0: 1}
    kinds = {(e["rank"], e["event"]) for e in view["events"]}
    assert (1, "link_down") in kinds and (0, "link_down") in kinds and (1, "failover") in kinds
    text = _text(render(view))
    assert "down" in text and "rank 1 link_down peer 0 rail 0 carrier" in text
    # the command line, once, as JSON
    res = CliRunner().invoke(main, ["status", "--targets", f"127.0.0.1:{base},127.0.0.1:{base + 1}", "--once",
                                    "--interval", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert [m["rank"] for m in d["ranks"]] == [0, 1]
    assert {(x["peer"], x["rail"], x["state"]) for x in d["ranks"][0]["links"]} >= {(1, 0, "down"), (1, 1, "up")}


def test_unreachable_targets_are_reported():
    base = free_base(1)
    view = Poller([Target("127.0.0.1", base)], timeout=0.5).poll()
    assert view["ranks"] == [] and f"127.0.0.1:{base}" in view["errors"]
    res = CliRunner().invoke(main, ["status", "--targets", f"127.0.0.1:{base}", "--once", "--interval", "0.1"])
    assert res.exit_code == 1 and "unreachable" in res.output


def test_targets_are_parsed():
    assert parse_targets("a:1, b:2") == [Target("a", 1), Target("b", 2)]
    for bad in ("a", "a:b", ":1", ""):
        with pytest.raises(UsageError):
            parse_targets(bad)


# ------------------------------------------------------------------ relays
def _busy_cross(comm, stop, cross, restore):
    """all_reduce until the stop file appears; when the cross file appears rank 1 loses rail 0 and rank 2 rail 1
    (they share no rail: a third rank relays), when the restore file appears both come back."""
    buf = np.ones(1 << 16, np.float32)
    flag = np.zeros(3, np.int32)
    state = 0
    while True:
        comm.all_reduce(buf)
        if comm.rank == 0:
            flag[:] = [os.path.exists(stop), os.path.exists(cross), os.path.exists(restore)]
        comm.broadcast(flag, 0)
        if flag[1] and state == 0:
            state = 1
            if comm.rank in (1, 2):
                comm.inject_fault(comm.rank - 1, "cut")
        if flag[2] and state == 1:
            state = 2
            if comm.rank in (1, 2):
                comm.inject_fault(comm.rank - 1, "restore")
        if flag[0]:
            return True
        time.sleep(0.01)


def test_the_view_shows_a_relayed_pair_via_whom_and_who_relays(tmp_path):
    base = free_base(4)
    stop, cross, restore = (str(tmp_path / n) for n in ("stop", "cross", "restore"))
    cfg = Config(metrics_port=base, timeout=60, failback_holddown=0.3)
    out = {}
    t = _start_ranks(4, _busy_cross, stop, cross, restore, config=cfg, out=out)
    targets = [Target("127.0.0.1", base + r) for r in range(4)]
    poller = Poller(targets)
    try:
        deadline = time.monotonic() + 60
        while len(poller.poll()["ranks"]) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        open(cross, "w").close()
        deadline = time.monotonic() + 30
        view = poller.poll()
        while time.monotonic() < deadline:
            view = poller.poll()
            by = {m["rank"]: m for m in view["ranks"]}
            if len(by) == 4 and by[1]["via"].get(2) is not None and by[2]["via"].get(1) is not None and any(
                    by[r]["relayed_pairs"] for r in (0, 3)):
                break
            time.sleep(0.2)
        by = {m["rank"]: m for m in view["ranks"]}
        via = by[1]["via"].get(2)
        assert via in (0, 3) and by[1]["relay_source"] == "snapshot", by[1]
        assert by[1]["relay_bytes"][2] > 0 and by[1]["primary"].get(2) == -1
        assert by[0]["via"] == {} and by[3]["via"] == {}  # nobody else is relayed
        assert by[via]["relayed_pairs"] >= 1, by[via]  # the relay says it passes a pair on
        text = _text(render(view))
        assert "2 via " in text and "1 via " in text and "pair" in text, text
        assert "relay_on" in text, text
        # the command line, as JSON
        res = CliRunner().invoke(main, ["status", "--targets", ",".join(f"127.0.0.1:{base + r}" for r in range(4)),
                                        "--once", "--interval", "0.2", "--json"])
        assert res.exit_code == 0, res.output
        d = {m["rank"]: m for m in json.loads(res.output)["ranks"]}
        assert d[1]["via"].get("2") in (0, 3) and d[2]["via"].get("1") in (0, 3)
        open(restore, "w").close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            by = {m["rank"]: m for m in poller.poll()["ranks"]}
            # direct again: the relay off and a rail to the peer (a relay can end before the rail is
            # back, through a relay that can no longer reach the other end: no path for a moment)
            if (by[1]["via"] == {} and by[2]["via"] == {} and by[1]["primary"].get(2) in (0, 1)
                    and by[2]["primary"].get(1) in (0, 1)):
                break
            time.sleep(0.2)
        assert by[1]["via"] == {} and by[1]["primary"].get(2) in (0, 1), by[1]  # direct again
        assert "relay_off" in _text(render(poller.poll()))  # and the events say how it ended
    finally:
        for p in (cross, restore, stop):
            open(p, "a").close()
        t.join(120)
    assert out.get("res") == [True] * 4, out


def test_relays_are_read_from_the_metrics_when_there_is_no_snapshot():
    from linkescape.tools.status import parse_snapshot, relays_from_metrics

    prev = {"relay_bytes_total": {"2:3": 1000, "3:0": 10}, "primary": {2: -1}}
    now = {"relay_bytes_total": {"2:3": 5000, "3:0": 10}, "primary": {2: -1, 3: 1}}
    assert relays_from_metrics(now, prev) == {2: 3}  # grew, and no rail carries peer 2
    assert relays_from_metrics(now, None) == {}
    assert relays_from_metrics({**now, "primary": {2: 0}}, prev) == {}  # back on a rail: not relayed
    snap = [{"comm": "g1", "peers": {"1": {"via": 0}}},
            {"peers": {"0": {"via": None, "relay_bytes": 0}, "2": {"via": 3, "relay_bytes": 77}},
             "relayed_pairs": 1, "relay_bytes": {"2:3": 99}}]
    assert parse_snapshot(snap) == {"via": {2: 3}, "relay_bytes": {2: 77}, "relayed_pairs": 1,
                                    "relay_bytes_total": {"2:3": 99}}
    assert parse_snapshot({"not": "a list"}) is None
