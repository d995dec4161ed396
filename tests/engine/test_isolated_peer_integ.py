"""A live peer that is cut off from every rail is waited for, never taken
for a dead one: ``no_path``, then the job resumes when a rail returns
(issue: "PeerLost only for a peer that is gone"). Real faults on the testbed."""

from __future__ import annotations

import signal
import time

import pytest

from linkescape.testbed import nft
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


def _lose_fin_and_rst(tb, host, rail, on):
    """Host ``host``'s NIC on ``rail`` loses every TCP FIN and RST that arrives: what another host's
    kernel says of a connection it closed is lost (as an RST it sent while its NIC had no carrier,
    which it never sends again)."""
    table = "le_t_finrst"
    script = (f'table netdev {table} {{\n  chain in {{ type filter hook ingress device "{tb.nic(rail)}" priority 0; '
              f'ip protocol tcp tcp flags & (fin | rst) != 0 drop; }}\n}}\n' if on else f"delete table netdev {table}\n")
    nft.apply(tb.netns(host), script)


def test_a_link_the_lower_rank_closed_while_cut_off_is_re_dialed_before_it_is_used(testbed_factory):
    """Host 0 (rank 0, which accepts rank 1's links) loses carrier on both rails between two operations
    and drops both links. Nothing of it reaches rank 1: not its NOTIFY_DOWN (rail 1 drops it, then
    loses carrier too), not its FIN or RST (host 1's rail 1 loses them here). Rank 1's links stay up
    in its view, idle (the probe budget is nearly off). After the repair the next operation finds rail
    0's link gone (an RST) and re-dials it, and the new link carries rank 0's word that rail 1's link
    is gone too: rank 1 re-dials rail 1 before it fails over onto it. Before, it failed over onto the
    dead link and found it only by its silence (or an RST, when one got through): the seed-191 hour of
    chaos stalled a stripe step 3.4 s on such a link, whose window was closed."""
    require_nft()
    tb = testbed_factory(2, 2)
    with Job(tb, op="all_reduce", count=1024, iters=3, gap=6.0,
             env={"LINKESCAPE_TIMEOUT": "60", "LINKESCAPE_PROBE_RATE": "0.01"}) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("done", rank=1, iter=0, timeout=60)
        time.sleep(0.3)  # both ranks idle
        t_cut = time.time()
        _lose_fin_and_rst(tb, 1, 1, True)
        tb.blackhole(0, 1)
        _isolate(tb, "cut", 0, 2)
        time.sleep(2.0)
        for rail in range(2):
            tb.restore(0, rail)
        job.wait_for("done", rank=1, iter=1, timeout=60)
        time.sleep(1.0)
        _lose_fin_and_rst(tb, 1, 1, False)
        exits = job.finish(timeout=120)
        for ex in exits:
            assert ex["error"] is None and not ex.get("hung") and ex["wrong"] == 0, (ex, job.stderr)
        trail = job.event_trail(1)
    downs = [e for e in trail if e["event"] == "link_down" and e["peer"] == 0 and e["rail"] == 1 and e["ts"] >= t_cut]
    assert downs, trail
    assert "closed its end" in (downs[0].get("detail") or ""), downs
    ups = [e for e in trail if e["event"] == "link_up" and e["peer"] == 0 and e["rail"] == 1 and e["ts"] > downs[0]["ts"]]
    assert ups, trail


def _silence_all_but_syn(tb, host, rails, on):
    """Host ``host``'s NICs drop every arriving TCP segment but a SYN: its links go silent (nothing
    it is sent arrives, nothing is acknowledged) while its kernel still answers a new connection's
    SYN on its listeners (the SYN-ACK leaves; the rest of the handshake is dropped)."""
    table = "le_t_synonly"
    if not on:
        nft.apply(tb.netns(host), f"delete table netdev {table}\n")
        return
    chains = "".join(f'  chain in{r} {{ type filter hook ingress device "{tb.nic(r)}" priority 0; '
                     f'ip protocol tcp tcp flags & syn == 0 drop; }}\n' for r in range(rails))
    nft.apply(tb.netns(host), f"table netdev {table} {{\n{chains}}}\n")


def test_a_stopped_process_whose_kernel_answers_is_waited_for_not_taken_for_dead(testbed_factory):
    """Rank 1 gets no CPU for 5 s (SIGSTOP: a rank starved on an overloaded host, its beacon thread
    too) while its links are silent (its NICs drop all but SYNs). Rank 0 finds no path, and rank 1's
    record in the store stops changing: before, that alone made rank 0 declare it lost after 2.5 s
    (seen at 64 ranks on 2 cores: a rank starved 3.7 s after a carrier loss, and one verdict failed
    the whole job). Now rank 0 first knocks on rank 1's listeners; its kernel accepts the
    connection, so the process exists, and it is waited for: the job goes on when it runs again."""
    require_nft()
    tb = testbed_factory(2, 2)
    with Job(tb, op="all_reduce", count=1 << 16, duration=10.0, gap=0.02,
             env={"LINKESCAPE_TIMEOUT": "60"}) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("done", rank=0, iter=5, timeout=60)
        _silence_all_but_syn(tb, 1, 2, True)
        job.procs[1].send_signal(signal.SIGSTOP)
        try:
            time.sleep(5.0)  # past the peer-lost timeout (2 s), the record's staleness (2.5 s) and a knock
        finally:
            _silence_all_but_syn(tb, 1, 2, False)
            job.procs[1].send_signal(signal.SIGCONT)
        exits = job.finish(timeout=120)
        for ex in exits:
            assert ex["error"] is None and not ex.get("hung") and ex["wrong"] == 0, (ex, job.stderr)
        trail = job.event_trail(0)
    assert not [e for e in trail if e["event"] == "peer_lost"], trail
    assert any(e["event"] == "no_path" and e["peer"] == 1 for e in trail), trail
