"""What the silence check relies on, on the real kernel: a lone segment lost once on a live path
is acknowledged only after ~200 ms or more (a tail-loss probe with one segment in flight waits out
the delayed-ack bound, as the minimum retransmission timeout does), as long as the silent timeout;
one more segment behind it draws a duplicate acknowledgement at once and a fast retransmission.
The engine therefore sends a follow-up frame on a link whose bytes wait for an interval before it
calls the link silent (``PeerChannel._follow_up``; virtual-time tests in tests/engine/test_peer_outcomes.py).
Before it, idle links of the failover testbed went down with no fault, acks missing for 204-212 ms."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from linkescape.testbed.netns import unique_name
from linkescape.testbed.pytest_fixtures import require_nft, require_testbed

pytestmark = pytest.mark.testbed

WORKER = os.path.join(os.path.dirname(__file__), "lone_loss_worker.py")


def test_a_lone_lost_segment_waits_for_the_kernel_unless_a_segment_follows_it():
    require_testbed()
    require_nft()
    ns = unique_name("ll")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, WORKER, "3"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        trials = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert all(t["dropped"] == 1 for t in trials), trials
    alone = [t for t in trials if not t["follow_up"]]
    followed = [t for t in trials if t["follow_up"]]
    # alone: the kernel repairs the loss only after the 200 ms silent timeout would have passed
    assert all(t["acked_ms"] > 200 for t in alone), alone
    # followed 50 ms later: a duplicate ack and a fast retransmission: all acknowledged well before the timeout
    assert all(t["follow_up_ms"] is not None and t["acked_ms"] < t["follow_up_ms"] + 100 for t in followed), followed
