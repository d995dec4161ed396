"""``dist.shrink_group`` on the linkescape backend (issue 47 item 1): after a killed rank the
survivors shrink the default group and every collective is exact afterwards (4 and 8 ranks);
SHRINK_ABORT ends what is in flight with an error, SHRINK_DEFAULT refuses while anything is;
a rank left out while still connected gets a typed error, never a result or a hang."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

TIMEOUT_S = 20.0


def _check_collectives(n: int) -> None:
    """Every collective of the (new) default group, against values computed here."""
    r = dist.get_rank()
    assert dist.get_world_size() == n
    t = torch.arange(1001, dtype=torch.float32) + r
    dist.all_reduce(t)
    assert torch.equal(t, (torch.arange(1001, dtype=torch.float32) * n + n * (n - 1) / 2)), t[:4]
    m = torch.full((300_001,), float(r + 1))
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.all(m == n)
    outs = [torch.empty(7, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.full((7,), r, dtype=torch.int64))
    assert [int(o[0]) for o in outs] == list(range(n)) and all(int(o[-1]) == q for q, o in enumerate(outs))
    b = torch.full((5,), float(r))
    dist.broadcast(b, src=n - 1)
    assert torch.all(b == n - 1)
    red = torch.full((9,), float(r))
    dist.reduce(red, dst=0)
    if r == 0:
        assert torch.all(red == n * (n - 1) / 2)
    rs = torch.empty(4)
    dist.reduce_scatter(rs, [torch.full((4,), float(r * 10 + q)) for q in range(n)])
    assert torch.all(rs == sum(q * 10 + r for q in range(n)))
    a2a = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.int64) + 100 * r)
    assert a2a.tolist() == [100 * q + r for q in range(n)]
    g = [torch.empty(2) for _ in range(n)] if r == 1 else None
    dist.gather(torch.full((2,), float(r)), g, dst=1)
    if r == 1:
        assert [float(x[0]) for x in g] == [float(q) for q in range(n)]
    sc = torch.empty(3)
    dist.scatter(sc, [torch.full((3,), float(q * 2)) for q in range(n)] if r == 0 else None, src=0)
    assert torch.all(sc == 2 * r)
    # point to point around the ring, and from any source
    got = torch.empty(6)
    w = dist.isend(torch.full((6,), float(r)), (r + 1) % n, tag=5)
    dist.recv(got, (r - 1) % n, tag=5)
    w.wait()
    assert torch.all(got == (r - 1) % n)
    if r == 0:
        srcs = sorted(dist.recv(torch.empty(1), tag=9) for _ in range(n - 1))
        assert srcs == list(range(1, n)), srcs
    else:
        dist.send(torch.ones(1), 0, tag=9)
    dist.barrier()


def killed_main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    r, n = dist.get_rank(), dist.get_world_size()
    victim = int(os.environ["VICTIM"])
    t = torch.ones(10)
    dist.all_reduce(t)
    if r == victim:
        time.sleep(0.5)  # the others are through the first collective
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(t)
        raise AssertionError("all_reduce survived the death of a rank")
    except dist.DistBackendError as exc:
        assert getattr(exc, "peer", None) == victim, str(exc)
    started = time.monotonic()
    group = dist.shrink_group([victim], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    took = time.monotonic() - started
    assert group is dist.distributed_c10d._get_default_group()
    assert dist.get_rank() == r - (r > victim) and group.size() == n - 1
    assert dist.get_process_group_ranks(group) == [q for q in range(n) if q != victim]
    _check_collectives(n - 1)
    if n == 4:
        # a second loss, in the shrunk group: the error names it (its global rank), a second shrink
        second = n - 1
        if r == second:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
            raise AssertionError("all_reduce survived the second death")
        except dist.DistBackendError as exc:
            assert exc.global_peer == second, (exc.global_peer, str(exc))
        dist.shrink_group([dist.get_world_size() - 1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
        _check_collectives(n - 2)
    print(f"rank {r}: shrunk in {took * 1e3:.1f} ms, now rank {dist.get_rank()} of {dist.get_world_size()}: ok",
          flush=True)
    dist.destroy_process_group()


def abort_main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    from linkescape.errors import GroupShrunk, LinkEscapeError

    r, n = dist.get_rank(), dist.get_world_size()
    left = n - 1
    dist.barrier()
    if r == left:
        # left out while connected: the others' goodbye makes its calls fail at once
        time.sleep(2.0)
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(8))
            raise AssertionError("the rank left out got a result")
        except dist.DistBackendError as exc:
            assert isinstance(exc.cause, LinkEscapeError), repr(exc)
            print(f"rank {r}: left out, {type(exc.cause).__name__} after {time.monotonic() - started:.2f}s: ok",
                  flush=True)
        return  # (the atexit handler closes)
    work = dist.all_reduce(torch.ones(1 << 20), async_op=True)  # the rank left out never joins
    time.sleep(0.3)
    assert not work.is_completed()
    with pytest.raises(ValueError):  # SHRINK_DEFAULT: refused while an operation is in flight
        dist.shrink_group([left])
    started = time.monotonic()
    dist.shrink_group([left], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    try:
        work.wait()
        raise AssertionError("the operation in flight survived SHRINK_ABORT")
    except dist.DistBackendError as exc:
        assert isinstance(exc.cause, GroupShrunk), repr(exc)
    assert time.monotonic() - started < 1.0
    _check_collectives(n - 1)
    time.sleep(3.0)  # the rank left out makes its call meanwhile
    print(f"rank {r}: ok", flush=True)
    dist.destroy_process_group()


def _run(mode: str, n: int, env=None):
    from linkescape.torch.testing import launch

    res = launch([os.path.abspath(__file__), mode], n, timeout=120, env=env)
    return res


@pytest.mark.parametrize("n,victim", [(4, 2), (8, 5)])
def test_shrink_group_after_a_killed_rank_every_collective_is_exact(n, victim):
    # (not rank 0: it holds the launcher's TCPStore, whose death ends the job's store)
    res = _run("killed", n, env={"VICTIM": str(victim)})
    for rr in res:
        if rr.rank == victim or (n == 4 and rr.rank == n - 1):
            assert rr.returncode == -signal.SIGKILL, rr.describe()
            continue
        assert rr.returncode == 0 and "ok" in rr.stdout, rr.describe()


def test_shrink_abort_ends_what_is_in_flight_and_the_rank_left_out_gets_an_error():
    res = _run("abort", 3)
    for rr in res:
        assert rr.returncode == 0 and "ok" in rr.stdout, rr.describe()


if __name__ == "__main__":
    {"killed": killed_main, "abort": abort_main}[sys.argv[1]]()
