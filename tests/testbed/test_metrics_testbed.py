"""Metrics of real ranks on the testbed, scraped inside their namespaces while a cable is really cut."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from linkescape.testbed.job import Job
from linkescape.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401
from linkescape.tools.status import Poller, Target, fetch, targets_of_testbed

pytestmark = pytest.mark.testbed

PORT = 19464


def scrape(target):
    out = {}
    for fam in text_string_to_metric_families(fetch(target, "/metrics").decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(m, metric, **labels):
    return m.get((metric, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def wait_until(targets, want, limit=30.0):
    deadline = time.monotonic() + limit
    while True:
        ms = [scrape(t) for t in targets]
        if want(*ms) or time.monotonic() > deadline:
            return ms
        time.sleep(0.1)


def test_metrics_follow_a_real_cable_cut(testbed):
    tb = testbed
    env = {"LINKESCAPE_METRICS_PORT": str(PORT), "LINKESCAPE_FAILBACK_HOLDDOWN_MS": "300"}
    with Job(tb, op="all_reduce", count=1 << 18, duration=25.0, gap=0.01, env=env) as job:
        job.wait_for("start", rank=0, timeout=60)
        job.wait_for("start", rank=1, timeout=60)
        targets = targets_of_testbed(tb.name, PORT)
        assert targets == [Target("127.0.0.1", PORT, tb.netns(0)), Target("127.0.0.1", PORT + 1, tb.netns(1))]
        m0, m1 = wait_until(targets, lambda a, b: (get(a, "linkescape_bytes_sent_total", peer=1, rail=0) or 0) > 1e6)
        assert get(m0, "linkescape_link_up", peer=1, rail=0) == 1 and get(m1, "linkescape_link_up", peer=0, rail=0) == 1
        assert get(m0, "linkescape_rail_info", rail=0, name="r0") == 1
        before = get(m0, "linkescape_bytes_sent_total", peer=1, rail=1)

        tb.cut(0, 0)  # host 0's NIC r0 loses carrier
        m0, m1 = wait_until(targets, lambda a, b: (
            get(a, "linkescape_link_up", peer=1, rail=0) == 0 and get(b, "linkescape_link_up", peer=0, rail=0) == 0
            and (get(a, "linkescape_bytes_sent_total", peer=1, rail=1) or 0) > before + 1e6))
        assert get(m0, "linkescape_link_up", peer=1, rail=0) == 0
        assert get(m1, "linkescape_link_up", peer=0, rail=0) == 0
        assert get(m0, "linkescape_link_events_total", event="link_down", cause="carrier", rail=0) >= 1
        assert get(m1, "linkescape_link_events_total", event="link_down", cause="peer_carrier", rail=0) >= 1
        assert get(m0, "linkescape_primary_rail", peer=1) == 1 and get(m1, "linkescape_primary_rail", peer=0) == 1
        assert get(m0, "linkescape_failover_seconds_count") >= 1
        assert get(m0, "linkescape_bytes_sent_total", peer=1, rail=1) > before + 1e6
        view = Poller(targets).poll()
        assert view["ranks"][0]["links"][(1, 0)]["state"] in ("down", "probing")

        tb.restore(0, 0)
        m0, m1 = wait_until(targets, lambda a, b: (
            get(a, "linkescape_link_up", peer=1, rail=0) == 1 and get(a, "linkescape_primary_rail", peer=1) == 0
            and get(b, "linkescape_primary_rail", peer=0) == 0))
        assert get(m0, "linkescape_link_up", peer=1, rail=0) == 1
        assert get(m0, "linkescape_primary_rail", peer=1) == 0 and get(m1, "linkescape_primary_rail", peer=0) == 0
        assert (get(m0, "linkescape_link_events_total", event="failback", cause="", rail=0) or 0) >= 1
        exits = job.finish(timeout=90)
    assert all(e.get("error") is None and e.get("wrong") == 0 for e in exits), exits
