"""The served metrics: real ranks over real sockets, scraped over HTTP while a fault happens."""

from __future__ import annotations

import json
import logging
import os
import random
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
    """A base port with ``n`` free ports after it (probed), below the kernel's ephemeral range (so no
    outgoing connection of a test running beside this one takes it meanwhile), in a stretch of its own
    for each pytest-xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    lo = 20000 + (int(worker) % 6 if worker.isdigit() else 0) * 2000
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(lo, lo + 2000 - n)
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
    # both sides: the peer learns the repair from the next rail word (a heartbeat), not at once
    back = lambda m0, m1: (get(m0, "linkescape_link_up", peer=1, rail=0) == 1  # noqa: E731
                           and get(m1, "linkescape_link_up", peer=0, rail=0) == 1
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
        # the library's logger does not propagate (its own NCCL-style handler): listen on it directly
        logger = logging.getLogger("linkescape")
        logger.addHandler(caplog.handler)
        try:
            with Communicator(FileStore(str(tmp_path / "s")), 0, 1, config=Config(metrics_port=port)) as comm:
                assert comm._metrics is None
                comm.barrier()
        finally:
            logger.removeHandler(caplog.handler)
    assert "cannot serve metrics" in caplog.text
    # loud: whoever holds the port is not this rank, and answers in its name (issue 48)
    assert "is NOT rank 0" in caplog.text and any(r.levelno >= logging.ERROR for r in caplog.records)


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


# ------------------------------------------------------------------ no client can hang anything (issue 17, item 5)
def _trickle(port, seconds, period=0.1, stop=None, text=b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 500):
    """A slowloris client: one byte every ``period``; returns how long the
    server let it go on (until it closed the connection, or ``seconds``)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    t0 = time.monotonic()
    try:
        for b in text:
            if time.monotonic() - t0 > seconds or (stop is not None and stop.is_set()):
                break
            s.send(bytes([b]))
            time.sleep(period)
    except OSError:  # cut off by the server
        pass
    finally:
        s.close()
    return time.monotonic() - t0


def _slow_clients(port, n, seconds, period=0.1):
    stop = threading.Event()
    threads = [threading.Thread(target=_trickle, args=(port, seconds, period, stop), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return stop, threads


def test_a_slow_client_does_not_block_metrics_or_healthz_for_another():
    from linkescape.metrics_server import MetricsServer

    server = MetricsServer(0)
    stop, threads = _slow_clients(server.port, 3, 6.0)
    try:
        time.sleep(0.3)  # the slow clients are in the middle of their requests
        for path in ("/healthz", "/metrics", "/snapshot", "/healthz"):
            t0 = time.monotonic()
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=3).read()
            assert time.monotonic() - t0 < 1.0, path
    finally:
        stop.set()
        server.close()
        for t in threads:
            t.join(10)


def test_a_request_has_a_whole_request_deadline():
    from linkescape.metrics_server import MetricsServer

    server = MetricsServer(0, request_deadline=1.0)
    try:
        lasted = _trickle(server.port, 8.0)  # a byte each 0.1 s: every read is quick, the request never ends
        assert 0.8 < lasted < 3.0, lasted
        # and a client that connects and says nothing is closed as well
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        t0 = time.monotonic()
        assert s.recv(100) == b"" and time.monotonic() - t0 < 3.0
        s.close()
    finally:
        server.close()


@pytest.mark.parametrize("how", ["close", "abort"])
def test_close_and_abort_return_within_a_second_whatever_a_client_does(tmp_path, how):
    base = free_base(1)
    comm = Communicator(FileStore(str(tmp_path / "s")), 0, 1, config=Config(metrics_port=base))
    stop, threads = _slow_clients(base, 3, 8.0)
    idle = socket.create_connection(("127.0.0.1", base), timeout=5)  # connected, silent
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        getattr(comm, how)()
        took = time.monotonic() - t0
        assert took < 1.0, took
        assert servers() == []
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{base}/healthz", timeout=2)
    finally:
        stop.set()
        idle.close()
        comm.abort()
        for t in threads:
            t.join(10)


class _Comm:
    """What the metrics server needs of a communicator. Its snapshot takes
    an "engine lock", as Communicator.snapshot() does, and counts itself."""

    def __init__(self, port):
        self.config = Config(metrics_port=port)
        self.rank, self.world_size, self.job, self.events = 0, 1, b"job-of-the-test", None
        self.lock = threading.Lock()
        self.taken = []

    def snapshot(self):
        with self.lock:
            self.taken.append(time.monotonic())
            return {"rank": 0, "world_size": 1, "rail_names": ["127.0.0.1"], "ops_pending": 0, "peers": {
                1: {"primary": 0, "links": [{"rail": 0, "usable": True, "state": "up", "bytes_sent": 5}]}}}


def test_snapshots_are_taken_at_most_twice_a_second_and_the_engine_lock_stays_free():
    from linkescape.metrics_server import attach

    comm = _Comm(free_base(1))
    reg = attach(comm)
    base = reg.port
    try:
        errors, bodies = [], []

        def scrape_many(path):
            try:
                for _ in range(10):
                    bodies.append(urllib.request.urlopen(f"http://127.0.0.1:{base}{path}", timeout=3).read())
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        scrapers = [threading.Thread(target=scrape_many, args=(p,)) for p in ("/snapshot", "/metrics") * 3]
        t0 = time.monotonic()
        for t in scrapers:
            t.start()
        # while clients scrape, the engine lock is free
        assert comm.lock.acquire(timeout=0.5)
        comm.lock.release()
        for t in scrapers:
            t.join(20)
        took = time.monotonic() - t0
        assert errors == [] and len(bodies) == 60
        assert all(b"linkescape_link_up" in b or b'"rank": 0' in b for b in bodies)
        # 60 requests: at most one snapshot per 0.5 s (and the first), not one each
        assert 1 <= len(comm.taken) <= 2 + int(took / 0.5), (len(comm.taken), took)
    finally:
        reg.close()
    assert servers() == []
