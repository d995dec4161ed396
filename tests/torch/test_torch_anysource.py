"""Receive from any source: ``dist.recv(t)`` / ``dist.irecv(t)`` without
``src`` (``ProcessGroup.recv_anysource``) on linkescape, the same program
on Gloo in the same processes: every message arrives once, into the right
tensor, and the reported source is the rank that sent it."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist


def _round(group, r, n, tag):
    """Every rank but 0 sends two tensors holding its rank; rank 0 receives
    them with any-source recv and irecv and returns the sources it saw."""
    seen = []
    if r == 0:
        for i in range(2 * (n - 1)):
            t = torch.full((10,), -1.0)
            if i % 2 == 0:
                src = dist.recv(t, group=group, tag=tag)
            else:
                w = dist.irecv(t, group=group, tag=tag)
                w.wait()
                src = dist.get_global_rank(group, w._source_rank()) if group is not None else w._source_rank()
            assert torch.all(t == src), f"the data of rank {src} is {t.tolist()}"
            seen.append(src)
    else:
        dist.send(torch.full((10,), float(r)), 0, group=group, tag=tag)
        dist.send(torch.full((10,), float(r)), 0, group=group, tag=tag)
    return seen


def main():
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    want = _round(gloo, r, n, tag=3)
    got = _round(None, r, n, tag=3)
    if r == 0:
        assert sorted(got) == sorted(want) == sorted(list(range(1, n)) * 2), (got, want)
    # a tagged any-source recv leaves other tags alone
    if r == 1:
        dist.send(torch.full((2,), 7.0), 0, tag=8)
        dist.send(torch.full((2,), 9.0), 0, tag=9)
    if r == 0:
        b9 = torch.empty(2)
        assert dist.recv(b9, tag=9) == 1 and b9.tolist() == [9.0, 9.0]
        b8 = torch.empty(2)
        assert dist.recv(b8, src=1, tag=8) == 1 and b8.tolist() == [7.0, 7.0]
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: ok", flush=True)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_recv_from_any_source_matches_gloo(nprocs):
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], nprocs, timeout=120)


if __name__ == "__main__":
    main()
