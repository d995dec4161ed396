"""Tests of the Prometheus metrics."""

from __future__ import annotations

import socket
import urllib.request

from linkescape.events import EventLog
from linkescape.metrics import Metrics, maybe_start_from_env


def value(m: Metrics, name: str, labels: dict | None = None):
    return m.registry.get_sample_value(name, labels or {})


def test_counters_move_and_export():
    m = Metrics()
    m.add_sent(1, 0, 1000)
    m.add_sent(1, 0, 24)
    m.add_received(1, 1, 7)
    assert value(m, "linkescape_bytes_sent_total", {"peer": "1", "rail": "0"}) == 1024
    assert value(m, "linkescape_bytes_received_total", {"peer": "1", "rail": "1"}) == 7
    text = m.generate_latest().decode()
    for name in ("linkescape_bytes_sent_total", "linkescape_bytes_received_total",
                 "linkescape_link_events_total", "linkescape_link_up", "linkescape_failover_seconds"):
        assert name in text


def test_events_via_eventlog_subscription():
    m = Metrics()
    log = EventLog(0, None)
    log.subscribe(m.observe_event)
    log.emit("link_up", peer=1, rail=0, cause="carrier", ts=99.0)
    log.emit("link_down", peer=1, rail=0, cause="carrier", ts=100.0)
    log.emit("failover", peer=1, rail=1, cause="carrier", ts=100.002, from_rail=0)
    log.emit("link_down", peer=2, rail=0, cause="timeout", ts=100.0)
    log.emit("failover", peer=2, rail=1, cause="timeout", ts=100.5, since=100.25)
    assert value(m, "linkescape_link_events_total", {"event": "link_down", "cause": "carrier", "rail": "0"}) == 1
    assert value(m, "linkescape_link_events_total", {"event": "failover", "cause": "timeout", "rail": "1"}) == 1
    assert value(m, "linkescape_link_up", {"peer": "1", "rail": "0"}) == 0
    assert value(m, "linkescape_failover_seconds_count") == 2
    assert abs(value(m, "linkescape_failover_seconds_sum") - (0.002 + 0.25)) < 1e-9
    assert value(m, "linkescape_failover_seconds_bucket", {"le": "0.005"}) == 1
    log.emit("link_up", peer=1, rail=0, cause="carrier")
    assert value(m, "linkescape_link_up", {"peer": "1", "rail": "0"}) == 1


def test_registries_are_separate():
    a, b = Metrics(), Metrics()
    a.add_sent(0, 0, 5)
    assert value(b, "linkescape_bytes_sent_total", {"peer": "0", "rail": "0"}) is None


def test_server_from_env_on_loopback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    m = Metrics()
    m.add_sent(3, 1, 42)
    assert maybe_start_from_env(0, m, {}) is None
    server = maybe_start_from_env(0, m, {"LINKESCAPE_METRICS_PORT": str(base)})
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{base}/metrics", timeout=5).read().decode()
        assert 'linkescape_bytes_sent_total{peer="3",rail="1"} 42.0' in body
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
