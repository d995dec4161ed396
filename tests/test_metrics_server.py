"""The served metrics: real ranks over real sockets, scraped over HTTP while a fault happens."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from linkescape import Communicator, Config, FileStore
from linkescape.metrics_server import port_offset, servers
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def free_base(n: int) -> int:
    """A base port with ``n`` free ports after it (probed)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(m: dict, name: str, **labels):
    return m.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def _scrape_through_fault(comm, base):
    """Rank 0 cuts its rail 0 and repairs it; both ranks keep all_reducing; rank 0
    scrapes both ranks' endpoints at each stage. The ranks agree on every step
    through a broadcast flag, so they run the same collectives."""
    r = comm.rank
    buf = np.ones(1 << 18, np.float32)
    seen = {}

    def step():
        comm.all_reduce(buf)

    def stage(name, want, limit=15.0):
        """Run collectives until rank 0 sees ``want(m0, m1)`` (or the limit)."""
        flag = np.zeros(1, np.int32)
        deadline = time.monotonic() + limit
        while True:
            step()
            if r == 0:
                m0, m1 = scrape(base), scrape(base + 1)
                ok = want(m0, m1)
                flag[0] = 1 if ok or time.monotonic() > deadline else 0
                if flag[0]:
                    seen[name] = (ok, m0, m1)
            comm.broadcast(flag, 0)
            if flag[0]:
                return

    healthy = lambda m0, m1: (get(m0, "linkescape_link_up", peer=1, rail=0) == 1  # noqa: E731
                              and (get(m0, "linkescape_bytes_sent_total", peer=1, rail=0) or 0) > 1 << 20)
    stage("healthy", healthy)
    if r == 0:
        comm.inject_fault(0, "cut")
    cut = lambda m0, m1: (get(m0, "linkescape_link_up", peer=1, rail=0) == 0  # noqa: E731
                          and get(m1, "linkescape_link_up", peer=0, rail=0) == 0
                          and get(m0, "linkescape_primary_rail", peer=1) == 1
                          and (get(m0, "linkescape_bytes_sent_total", peer=1, rail=1) or 0) > 1 << 20)
    stage("cut", cut)
    if r == 0:
        comm.inject_fault(0, "restore")
    back = lambda m0, m1: (get(m0, "linkescape_link_up", peer=1, rail=0) == 1  # noqa: E731
                           and get(m0, "linkescape_primary_rail", peer=1) == 0
                           and (get(m0, "linkescape_link_events_total", event="failback", cause="", rail=0) or 0) >= 1)
    stage("back", back)
    comm.barrier()
    return {k: v[0] for k, v in seen.items()}, (
        {k: (v[1], v[2]) for k, v in seen.items()} if r == 0 else None)


def test_scraped_gauges_and_counters_follow_a_fault():
    base = free_base(2)
    cfg = Config(metrics_port=base, failback_holddown=0.3, timeout=60)
    res = raise_first(run_ranks(2, _scrape_through_fault, base, rails=RAILS, config=cfg, timeout=120))
    ok, scraped = res[0]
    assert ok == {"healthy": True, "cut": True, "back": True}, ok
    h0, _ = scraped["healthy"]
    c0, c1 = scraped["cut"]
    b0, b1 = scraped["back"]
    # counters: the cut is counted on both sides, with its cause, and the failover timed
    assert get(c0, "linkescape_link_events_total", event="link_down", cause="carrier", rail=0) >= 1
    assert get(c1, "linkescape_link_events_total", event="link_down", cause="peer_carrier", rail=0) >= 1
    assert get(c0, "linkescape_link_events_total", event="failover", cause="carrier", rail=1) >= 1
    assert get(c0, "linkescape_failover_seconds_count") >= 1
    assert get(c0, "linkescape_link_failures_total", peer=1, rail=0) >= 1
    # bytes: rail 1 carried the traffic while rail 0 was cut; counters never go down
    assert get(c0, "linkescape_bytes_sent_total", peer=1, rail=1) > get(h0, "linkescape_bytes_sent_total",
                                                                          peer=1, rail=1)
    for name in ("linkescape_bytes_sent_total", "linkescape_bytes_received_total"):
        for rail in (0, 1):
            assert get(b0, name, peer=1, rail=rail) >= get(c0, name, peer=1, rail=rail) >= get(h0, name, peer=1,
                                                                                                 rail=rail)
    # after the repair: up again, primary again
    assert get(b1, "linkescape_link_up", peer=0, rail=0) == 1
    assert get(b0, "linkescape_info", rank=0, world_size=2, policy="active-backup") == 1
    assert get(b0, "linkescape_ops_total", op="all_reduce") >= 3
    assert get(b0, "linkescape_collective_seq", state="done") >= 3


def _two_comms(rank, n, store_dir, base):
    """A world and a second communicator (as torch new_group makes) in one process."""
    world = Communicator(FileStore(os.path.join(store_dir, "world")), rank, n, rails=["127.0.0.1"],
                         config=Config(metrics_port=base))
    sub = Communicator(FileStore(os.path.join(store_dir, "sub")), rank, n, rails=["127.0.0.1"],
                       config=Config(metrics_port=base))
    try:
        world.all_reduce(np.ones(1000, np.float32))
        sub.all_reduce(np.ones(10, np.float32))
        same = world._metrics.server is sub._metrics.server
        m = scrape(base + rank)
        sub.close()
        after_sub = scrape(base + rank)
        world.barrier()
    finally:
        sub.close()
        world.close()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=2)
        refused = False
    except OSError:
        refused = True
    names = {t.name for t in threading.enumerate()}
    return same, m, after_sub, refused, sorted(n for n in names if n.startswith("linkescape"))


def test_one_server_per_process_every_communicator_on_it_stopped_at_close():
    base = free_base(2)
    res = raise_first(run_ranks(2, _two_comms, base, make_comm=False, timeout=90))
    for rank, (same, m, after_sub, refused, threads) in enumerate(res):
        assert same
        peer = 1 - rank
        assert get(m, "linkescape_op_bytes_total", op="all_reduce") == 4000
        assert get(m, "linkescape_op_bytes_total", op="all_reduce", comm=1) == 40
        assert get(m, "linkescape_link_up", peer=peer, rail=0) == 1
        assert get(m, "linkescape_link_up", peer=peer, rail=0, comm=1) == 1
        assert get(after_sub, "linkescape_link_up", peer=peer, rail=0, comm=1) is None  # unregistered at close
        assert get(after_sub, "linkescape_link_up", peer=peer, rail=0) == 1
        assert refused, "the server outlived the last communicator"
        assert threads == [], threads


def test_events_and_snapshot_endpoints(tmp_path):
    base = free_base(1)
    with Communicator(FileStore(str(tmp_path / "s")), 0, 1, config=Config(metrics_port=base)) as comm:
        comm.events.emit("link_down", peer=1, rail=0, cause="carrier")
        ev = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{base}/events?n=5", timeout=5).read())
        snap = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{base}/snapshot", timeout=5).read())
        assert [e["event"] for e in ev] == ["link_down"] and ev[0]["rank"] == 0
        assert snap[0]["rank"] == 0 and snap[0]["world_size"] == 1
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{base}/nothing", timeout=5)
    assert servers() == []


def test_port_taken_is_logged_not_raised(tmp_path, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with Communicator(FileStore(str(tmp_path / "s")), 0, 1, config=Config(metrics_port=port)) as comm:
            assert comm._metrics is None
            comm.barrier()
    assert "cannot serve metrics" in caplog.text


def test_port_offset_is_local_rank_when_set():
    assert port_offset(5, {}) == 5
    assert port_offset(5, {"LOCAL_RANK": "1"}) == 1
    assert port_offset(5, {"LOCAL_RANK": "x"}) == 5


def test_config_reads_the_variables():
    from linkescape.errors import ConfigError

    cfg = Config.from_env({"LINKESCAPE_METRICS_PORT": "9400", "LINKESCAPE_METRICS_ADDR": "0.0.0.0",
                           "LINKESCAPE_TRACE_BUFFER": "50", "LINKESCAPE_TRACE_DIR": "/tmp/x"})
    assert (cfg.metrics_port, cfg.metrics_addr, cfg.trace_buffer, cfg.trace_dir) == (9400, "0.0.0.0", 50, "/tmp/x")
    assert Config.from_env({}).trace_buffer == 2000 and Config.from_env({}).metrics_port is None
    for var, bad in (("LINKESCAPE_METRICS_PORT", "http"), ("LINKESCAPE_METRICS_PORT", "70000"),
                     ("LINKESCAPE_TRACE_BUFFER", "-1"), ("LINKESCAPE_TRACE_BUFFER", "many")):
        with pytest.raises(ConfigError):
            Config.from_env({var: bad})
