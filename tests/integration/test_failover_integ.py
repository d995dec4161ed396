"""Real faults on real kernel NICs (testbed namespaces, veth, bridges, tbf, nft).

Every test checks: every result bit for bit against an exact reference (the
workers do it, on every operation), no error reached the caller, nothing hung,
and the event trail says what happened, with the right cause.
"""

from __future__ import annotations

import time

import pytest

from linkescape.testbed.job import Job
from linkescape.testbed.pytest_fixtures import require_nft

pytestmark = pytest.mark.testbed

FAST = {"LINKESCAPE_FAILBACK_HOLDDOWN_MS": "300"}
BIG_CHUNKS = {**FAST, "LINKESCAPE_CHUNK_BYTES": "8M"}


def _events(job, rank):
    trail = job.event_trail(rank)
    print(rank, [(round(e["ts"] % 100, 3), e["event"], e.get("detail")) for e in trail])
    return [(e["event"], e.get("cause"), e.get("rail"), e.get("peer")) for e in trail]


def _assert_clean(exits, job=None):
    if job is not None and any(ex["error"] for ex in exits):
        print("\n".join(job.stderr))
    for ex in exits:
        assert not ex.get("hung"), ex
        assert ex["error"] is None, ex
        assert ex["wrong"] == 0, ex
    assert len({ex["digest"] for ex in exits if "digest" in ex}) >= 1


def _fault(tb, kind, host, rail):
    if kind == "cut":
        return tb.cut(host, rail)
    if kind == "blackhole":
        return tb.blackhole(host, rail)
    raise ValueError(kind)


def _run_with_fault(tb, op, kind, moment, *, count=4 << 20, iters=10, env=FAST, fault_host=0, peer_side=False):
    gap = 0.3 if moment == "idle" else 0.0
    with Job(tb, op=op, count=count, iters=iters, gap=gap, env=env) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        if moment == "idle":
            job.wait_for("done", rank=0, iter=1, timeout=60)
            time.sleep(0.05)
        elif moment == "mid-op":
            job.wait_for("start", rank=0, iter=2, timeout=60)
        else:  # mid-chunk: well inside an 8 MiB frame on a 1 Gbit/s rail
            job.wait_for("start", rank=0, iter=2, timeout=60)
            time.sleep(0.03)
        host = 1 - fault_host if peer_side else fault_host
        t_fault = _fault(tb, kind, host, 0)
        job.wait_for("done", rank=0, iter=5, timeout=60)
        tb.restore(host, 0)
        exits = job.finish(timeout=120)
        _assert_clean(exits, job)
        return {r: _events(job, r) for r in range(2)}, exits, t_fault


@pytest.mark.parametrize("moment", ["idle", "mid-op", "mid-chunk"])
@pytest.mark.parametrize("kind", ["cut", "blackhole", "peer-cut"])
def test_fault_kind_by_moment_all_reduce(testbed_factory, kind, moment):
    if kind == "blackhole":
        require_nft()
    tb = testbed_factory(2, 2, rate="1gbit")
    env = BIG_CHUNKS if moment == "mid-chunk" else FAST
    ev, exits, t_fault = _run_with_fault(tb, "all_reduce", "cut" if kind == "peer-cut" else kind, moment,
                                         iters=12, env=env, peer_side=kind == "peer-cut")
    ev0, ev1 = ev[0], ev[1]
    faulty, other = (ev1, ev0) if kind == "peer-cut" else (ev0, ev1)
    own_cause = {"cut": "carrier", "peer-cut": "carrier", "blackhole": "timeout"}[kind]
    peer_cause = {"cut": "peer_carrier", "peer-cut": "peer_carrier", "blackhole": "timeout"}[kind]
    assert ("link_down", own_cause, 0, 1 if faulty is ev0 else 0) in faulty, faulty
    assert any(e[0] == "failover" and e[2] == 1 for e in faulty), faulty
    assert any(e[0] == "link_down" and e[1] == peer_cause for e in other), other
    assert any(e[0] == "failover" for e in other), other
    # the repaired rail comes back and traffic returns to it
    assert any(e[0] == "link_up" and e[2] == 0 for e in ev0 + ev1)


@pytest.mark.parametrize("op", ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
                                "scatter", "sendrecv"])
def test_cut_mid_operation_every_op(testbed_factory, op):
    tb = testbed_factory(2, 2, rate="1gbit")
    ev, exits, _ = _run_with_fault(tb, op, "cut", "mid-op", count=2 << 20, iters=10)
    assert any(e[0] == "failover" for e in ev[0])


def test_flapping_rail_no_errors_no_storm(testbed_factory):
    tb = testbed_factory(2, 2, rate="1gbit")
    with Job(tb, op="all_reduce", count=2 << 20, duration=4.0, env={"LINKESCAPE_FAILBACK_HOLDDOWN_MS": "1000"},
             async_depth=2) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("start", rank=0, iter=1, timeout=60)
        flaps = tb.flap(0, 0, period=0.3, count=5)
        exits = job.finish(timeout=120)
        _assert_clean(exits, job)
        ev = _events(job, 0)
    downs = [e for e in ev if e[0] == "link_down" and e[2] == 0]
    assert downs, ev
    # hold-down: traffic does not chase a rail that keeps flapping
    assert sum(1 for e in ev if e[0] == "failback") <= 2, ev
    assert len(flaps) >= 5


def test_failback_after_repair(testbed_factory):
    tb = testbed_factory(2, 2, rate="1gbit")
    with Job(tb, op="all_reduce", count=1 << 20, duration=3.5, env=FAST) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("start", rank=0, iter=2, timeout=60)
        tb.cut(0, 0)
        time.sleep(0.8)
        tb.restore(0, 0)
        exits = job.finish(timeout=120)
        _assert_clean(exits, job)
        ev = _events(job, 0)
    names = [e[0] for e in ev]
    assert names.index("link_down") < names.index("failover") < names.index("link_up") < names.index("failback"), ev
    assert [e for e in ev if e[0] == "failback"][0][2] == 0


def test_two_failures_on_different_hosts_and_second_before_repair(testbed_factory):
    """4 hosts: rail 0 cut on host 0, then rail 0 of host 2 blackholed before
    the first is repaired; every pair keeps a path on rail 1."""
    require_nft()
    tb = testbed_factory(4, 2, rate="1gbit")
    with Job(tb, op="all_reduce", count=1 << 20, iters=14, env=FAST) as job:
        for r in range(4):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("start", rank=0, iter=2, timeout=60)
        tb.cut(0, 0)
        job.wait_for("done", rank=0, iter=4, timeout=60)
        tb.blackhole(2, 0)
        job.wait_for("done", rank=0, iter=7, timeout=60)
        tb.restore(0, 0)
        tb.restore(2, 0)
        exits = job.finish(timeout=180)
        _assert_clean(exits, job)
        assert any(e[0] == "failover" for e in _events(job, 2))


def test_no_path_left_raises_link_failure_after_deadline(testbed_factory):
    tb = testbed_factory(2, 2)
    with Job(tb, op="all_reduce", count=1 << 16, duration=30, gap=0.05,
             env={"LINKESCAPE_NO_PATH_TIMEOUT": "1.5", "LINKESCAPE_TIMEOUT": "60"}) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        job.wait_for("done", rank=0, iter=2, timeout=60)
        t0 = time.monotonic()
        tb.cut(0, 0)
        tb.cut(0, 1)
        exits = job.finish(timeout=60)
        took = time.monotonic() - t0
        ev = _events(job, 0)
    for ex in exits:
        assert ex["error_type"] == "LinkFailure", ex
    assert took < 20
    assert any(e[0] == "no_path" for e in ev)


def test_a_paused_rank_is_not_a_dead_link(testbed_factory):
    """A rank stopped for longer than the silent timeout (descheduled, swapping)
    must not find its healthy links silent when it runs again."""
    import signal

    tb = testbed_factory(2, 2)
    with Job(tb, op="all_reduce", count=1 << 16, iters=30, gap=0.3) as job:
        for r in range(2):
            job.wait_for("ready", rank=r, timeout=60)
        for it in (2, 6, 10):
            job.wait_for("done", rank=1, iter=it, timeout=60)
            job.procs[1].send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            job.procs[1].send_signal(signal.SIGCONT)
        exits = job.finish(timeout=120)
        _assert_clean(exits, job)
        trails = [_events(job, r) for r in range(2)]
    assert not any(e[0] in ("link_down", "peer_lost") for trail in trails for e in trail), trails
