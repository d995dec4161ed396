"""A lossy rail (carrier up, 20% of packets dropped by nftables ``numgen
random``) is a grey failure: its link goes down (``degraded`` when goodput
collapses, ``timeout`` when a retransmission leaves it silent first), traffic
moves to the healthy rail, and it is used again only after the repair, once
it stayed clean for the hold-down: it never flaps. Results stay exact."""

from __future__ import annotations

import time

import pytest

from linkescape.testbed.job import Job
from linkescape.testbed.pytest_fixtures import require_nft

pytestmark = pytest.mark.testbed


def test_a_lossy_rail_is_degraded_then_used_again_after_the_repair(testbed_factory):
    require_nft()
    tb = testbed_factory(2, 2, rate="1gbit")
    with Job(tb, op="all_reduce", count=1 << 20, duration=14.0, env={"LINKESCAPE_TIMEOUT": "60"}) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        time.sleep(3.0)  # a healthy reference first
        t_fault = time.time()
        tb.lossy(0, 0, 20.0)
        time.sleep(5.0)
        t_repair = time.time()
        tb.restore(0, 0)
        exits = job.finish(timeout=120)
        for ex in exits:
            assert ex["error"] is None and not ex.get("hung") and ex["wrong"] == 0, (ex, job.stderr)
        trails = [job.event_trail(r) for r in range(2)]
    downs = [e for t in trails for e in t if e["event"] == "link_down" and e["ts"] >= t_fault]
    assert downs and all(e["rail"] == 0 for e in downs), trails
    assert {e["cause"] for e in downs} <= {"degraded", "timeout", "socket_error"}, downs
    assert min(e["ts"] for e in downs) - t_fault < 4.0, (t_fault, downs)
    for trail in trails:
        fails = [e for e in trail if e["event"] == "failover" and e["ts"] >= t_fault]
        assert fails, trail
        # the lossy rail is not used again while the loss lasts: no failback before the repair
        backs = [e for e in trail if e["event"] == "failback" and e["ts"] >= t_fault]
        assert all(e["ts"] > t_repair for e in backs), (t_repair, trail)
