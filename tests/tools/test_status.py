"""`linkescape status`: the live view, read from real ranks' metrics endpoints."""

from __future__ import annotations

import json
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
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


@pytest.fixture
def job(tmp_path):
    base = free_base(2)
    stop, cut = str(tmp_path / "stop"), str(tmp_path / "cut")
    cfg = Config(metrics_port=base, timeout=60)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", run_ranks(2, _busy, stop, cut, rails=RAILS,
                                                                        config=cfg, timeout=120)))
    t.start()
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
