"""A rank killed mid-job: every other rank raises a DistBackendError subclass
that names the lost peer, well within the timeout; nobody hangs or dumps
core. Also: refused operations and waits with a timeout."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

TIMEOUT_S = 20.0


def kill_main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    from linkescape.errors import LinkEscapeError
    from linkescape.torch import LinkEscapeBackendError

    r, n = dist.get_rank(), dist.get_world_size()
    victim = n - 1
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == n
    dist.barrier()
    if r == victim:
        time.sleep(0.5)  # let the others block in the next all_reduce
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        if r == 0:
            dist.all_reduce(t)  # blocking: the error comes from wait()
        else:
            work = dist.all_reduce(t, async_op=True)
            work.get_future().wait()  # the error comes through the future
        raise AssertionError("all_reduce survived the death of a rank")
    except LinkEscapeBackendError as exc:
        took = time.monotonic() - start
        assert isinstance(exc, dist.DistBackendError)
        assert isinstance(exc.cause, LinkEscapeError) and exc.__cause__ is exc.cause, repr(exc.cause)
        assert exc.peer == victim, (exc.peer, str(exc))
        assert f"peer rank {victim}" in str(exc), str(exc)
        print(f"rank {r}: raised after {took:.2f}s: {type(exc.cause).__name__}: {exc}", flush=True)
        assert took < TIMEOUT_S / 2, took
    # later operations fail at once too
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        raise AssertionError("all_reduce after the loss did not raise")
    except dist.DistBackendError:
        assert time.monotonic() - start < TIMEOUT_S / 2
    if r == 0:
        dist.destroy_process_group()
    # rank 1 exits without destroy_process_group: the atexit handler closes
    print(f"rank {r}: ok", flush=True)


def refuse_main():
    """Waits with a timeout, refused ops, bad arguments: clear errors, no hang."""
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    from linkescape.torch import LinkEscapeBackendError

    r, n = dist.get_rank(), dist.get_world_size()
    # a recv that nobody matches: wait(timeout) raises, the op stays pending
    buf = torch.empty(4)
    if r == 0:
        w = dist.irecv(buf, 1, tag=77)
        start = time.monotonic()
        try:
            w.wait(datetime.timedelta(seconds=0.5))
            raise AssertionError("wait(timeout) returned")
        except LinkEscapeBackendError as exc:
            assert "CommTimeout" in str(exc) and 0.4 < time.monotonic() - start < 5, str(exc)
        assert not w.is_completed()
    dist.barrier()
    if r == 1:
        dist.send(torch.arange(4.0), 0, tag=77)
    if r == 0:
        w.wait()
        assert torch.equal(buf, torch.arange(4.0))
    # recv from any source is supported (issue 9): it names the sender
    if r == 1:
        dist.send(torch.full((1,), 5.0), 0)
    if r == 0:
        got = torch.empty(1)
        assert dist.recv(got) == 1 and got.item() == 5.0
    try:
        dist.all_gather([torch.empty(3) for _ in range(n)], torch.empty(2))
        raise AssertionError("all_gather of mismatched sizes accepted")
    except ValueError:
        pass
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: ok", flush=True)


def timeout_main():
    """init_process_group(timeout=...) bounds every operation."""
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=2))
    from linkescape.errors import CommTimeout
    from linkescape.torch import LinkEscapeBackendError

    r = dist.get_rank()
    assert dist.group.WORLD.communicator.config.timeout == 2.0
    if r == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(3))  # rank 1 never joins
            raise AssertionError("all_reduce without a partner returned")
        except LinkEscapeBackendError as exc:
            took = time.monotonic() - start
            assert isinstance(exc.cause, CommTimeout) and exc.peer == 1, str(exc)
            assert 1.5 < took < 6, took
    else:
        time.sleep(4)
    print(f"rank {r}: ok", flush=True)
    # the group is out of step now: exit without destroy_process_group


def test_killed_rank_raises_everywhere():
    from linkescape.torch.testing import failures, launch

    n = 3
    start = time.monotonic()
    res = launch([os.path.abspath(__file__), "kill"], n, timeout=60)
    bad = failures(res, expect_rc={n - 1: -signal.SIGKILL})
    assert not bad, bad
    for r in res[:-1]:
        assert f"rank {r.rank}: ok" in r.stdout, r.describe()
        assert "peer rank 2" in r.stdout
    assert time.monotonic() - start < 45


def test_init_timeout_bounds_operations():
    from linkescape.torch.testing import failures, launch

    res = launch([os.path.abspath(__file__), "timeout"], 2, timeout=60)
    bad = failures(res)
    assert not bad, bad


def test_wait_timeout_and_refused_ops():
    from linkescape.torch.testing import failures, launch

    res = launch([os.path.abspath(__file__), "refuse"], 2, timeout=60)
    bad = failures(res)
    assert not bad, bad


if __name__ == "__main__":
    {"kill": kill_main, "refuse": refuse_main, "timeout": timeout_main}[sys.argv[1]]()
