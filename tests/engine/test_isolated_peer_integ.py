"""A live peer that is cut off from every rail is waited for, never taken
for a dead one: ``no_path``, then the job resumes when a rail returns
(issue: "PeerLost only for a peer that is gone"). Real faults on the testbed."""

from __future__ import annotations

import time

import pytest

from linkescape.testbed.job import Job
from linkescape.testbed.pytest_fixtures import require_nft

pytestmark = pytest.mark.testbed


def _isolate(tb, kind, host, rails):
    for rail in range(rails):
        (tb.cut if kind == "cut" else tb.blackhole)(host, rail)


@pytest.mark.parametrize("kind", ["cut", "blackhole"])
def test_a_live_isolated_peer_is_waited_for(testbed_factory, kind):
    if kind == "blackhole":
        require_nft()
    tb = testbed_factory(3, 2)
    with Job(tb, op="all_reduce", count=1 << 16, duration=9.0, gap=0.02,
             env={"LINKESCAPE_TIMEOUT": "60", "LINKESCAPE_FAILBACK_HOLDDOWN_MS": "300"}) as job:
        for r in range(3):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("done", rank=0, iter=5, timeout=60)
        _isolate(tb, kind, 2, 2)
        time.sleep(3.0)  # longer than the silent timeout, the old 1.5 s "did not come back" and 2 s timers
        t_back = time.time()
        for rail in range(2):
            tb.restore(2, rail)
        exits = job.finish(timeout=120)
        for ex in exits:
            assert ex["error"] is None and not ex.get("hung") and ex["wrong"] == 0, (ex, job.stderr)
        trails = {r: job.event_trail(r) for r in range(3)}
    for r, trail in trails.items():
        assert not [e for e in trail if e["event"] == "peer_lost"], (r, trail)
    assert any(e["event"] == "no_path" and e["peer"] == 2 for e in trails[0]), trails[0]
    # the first path back is used at once (no hold-down on it): within 1.5 s
    ups = [e["ts"] for e in trails[0] if e["event"] == "link_up" and e["peer"] == 2 and e["ts"] >= t_back]
    assert ups and min(ups) - t_back < 1.5, (t_back, trails[0])
