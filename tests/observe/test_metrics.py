"""The Prometheus collector: what snapshots and events turn into, label sets, several communicators."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from linkescape.events import EventLog
from linkescape.metrics import CommMetrics, Exporter, Metrics


def value(m: Metrics, name: str, labels: dict | None = None):
    return m.registry.get_sample_value(name, labels or {})


def _snap(rail0_up=True, sent0=100, sent1=0, primary=0, **extra):
    link = lambda rail, up, sent: {"rail": rail, "state": "up" if up else "down", "usable": up,  # noqa: E731
                                   "active": rail == primary, "bytes_sent": sent, "bytes_received": sent // 2,
                                   "failures": 0 if up else 1, "down_cause": None if up else "carrier"}
    return {"rank": 0, "world_size": 2, "rails": 2, "ops_pending": 1, "rail_names": ["eth0", "eth1"],
            "peers": {1: {"peer": 1, "primary": primary, "active": [primary], "sent": 7, "acked": 5, "received": 6,
                          "unacked_bytes": 4096, "no_path_s": None, "lost": None,
                          "links": [link(0, rail0_up, sent0), link(1, True, sent1)], **extra}}, **extra}


def test_snapshot_becomes_the_contract_metrics():
    state = {"snap": _snap()}
    m = Metrics(snapshot=lambda: state["snap"])
    lab = {"peer": "1", "rail": "0"}
    assert value(m, "linkescape_bytes_sent_total", lab) == 100
    assert value(m, "linkescape_bytes_received_total", lab) == 50
    assert value(m, "linkescape_link_up", lab) == 1
    assert value(m, "linkescape_link_up", {"peer": "1", "rail": "1"}) == 1
    assert value(m, "linkescape_primary_rail", {"peer": "1"}) == 0
    assert value(m, "linkescape_link_state", {**lab, "state": "up"}) == 1
    assert value(m, "linkescape_link_state", {**lab, "state": "down"}) == 0
    assert value(m, "linkescape_unacked_bytes", {"peer": "1"}) == 4096
    assert value(m, "linkescape_frames_acked_total", {"peer": "1"}) == 5
    assert value(m, "linkescape_rail_info", {"rail": "1", "name": "eth1"}) == 1
    # read at scrape time: the next scrape follows the communicator
    state["snap"] = _snap(rail0_up=False, sent0=100, sent1=5000, primary=1)
    assert value(m, "linkescape_link_up", lab) == 0
    assert value(m, "linkescape_link_failures_total", lab) == 1
    assert value(m, "linkescape_bytes_sent_total", {"peer": "1", "rail": "1"}) == 5000
    assert value(m, "linkescape_primary_rail", {"peer": "1"}) == 1
    # not there until the snapshot has it
    assert value(m, "linkescape_rejected_connections_total") is None
    state["snap"] = _snap(rejected_connections=3, replayed_bytes=1 << 20)
    assert value(m, "linkescape_rejected_connections_total") == 3
    assert value(m, "linkescape_replayed_bytes_total", {"peer": "1"}) == 1 << 20
    assert value(m, "linkescape_store_untrusted") is None
    state["snap"] = _snap(store_untrusted=None)
    assert value(m, "linkescape_store_untrusted") == 0
    state["snap"] = _snap(store_untrusted="alive/1: forged")
    assert value(m, "linkescape_store_untrusted") == 1


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
    assert value(m, "linkescape_failover_seconds_count") == 2
    assert abs(value(m, "linkescape_failover_seconds_sum") - (0.002 + 0.25)) < 1e-9
    assert value(m, "linkescape_failover_seconds_bucket", {"le": "0.005"}) == 1
    assert value(m, "linkescape_failover_seconds_bucket", {"le": "+Inf"}) == 2
    assert value(m, "linkescape_last_event_timestamp_seconds", {"event": "failover"}) == 100.5


def test_no_path_time_is_counted_as_stall():
    m = Metrics()
    m.observe_event({"ts": 10.0, "event": "no_path", "peer": 1, "rail": 0, "cause": "carrier"})
    m.observe_event({"ts": 12.5, "event": "link_up", "peer": 1, "rail": 1, "cause": None})
    m.observe_event({"ts": 20.0, "event": "peer_lost", "peer": 1, "rail": -1, "cause": "socket_error"})
    assert value(m, "linkescape_stall_seconds_total", {"peer": "1"}) == 2.5
    assert value(m, "linkescape_link_events_total", {"event": "peer_lost", "cause": "socket_error", "rail": "-1"}) == 1


def test_second_communicator_gets_its_own_label():
    ex = Exporter()
    a, b = CommMetrics(snapshot=_snap), CommMetrics(snapshot=lambda: _snap(sent0=7))
    assert ex.add(a) == {} and ex.add(b) == {"comm": "1"}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ex)
    text = generate_latest(reg).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "linkescape_bytes_sent_total" and s.labels.get("rail") == "0"]
    assert sorted((s.labels.get("comm", ""), s.value) for s in samples) == [("", 100.0), ("1", 7.0)]
    # exactly the contract's labels on the first communicator
    assert {"peer", "rail"} == set(next(s for s in samples if "comm" not in s.labels).labels)
    assert ex.remove(a) == 1 and ex.remove(b) == 0


def test_a_failing_snapshot_still_exports_events():
    def broken():
        raise RuntimeError("closing")

    m = Metrics(snapshot=broken)
    m.observe_event({"ts": 1.0, "event": "link_down", "peer": 1, "rail": 0, "cause": "carrier"})
    assert value(m, "linkescape_link_events_total", {"event": "link_down", "cause": "carrier", "rail": "0"}) == 1
    assert "linkescape_link_up" not in m.generate_latest().decode()
