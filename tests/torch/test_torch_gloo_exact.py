"""Code written for a Gloo group, through the C++ ``ProcessGroup`` API on a
``FileStore``, run on a Gloo group and on a linkescape group in the same
processes: the results must be *exactly* Gloo's (same structure, same bits)
at 2, 3 and 4 ranks.

- float16 and bfloat16 all_reduce SUM: Gloo's ring rounds after every
  addition, in an order fixed by its chunking; linkescape combines every
  element in that same order (``ring.all_reduce_gloo_order``).
- all_gather with several inputs per rank: every output list gets all
  inputs, and the future's value is the list of lists (one list when there is
  one), as Gloo's.
- all_gather of non-contiguous inputs and outputs, and under
  ``torch.inference_mode()``.
- A per-call timeout (options or ``timeout=``) is enforced for that call:
  the call fails after about that long, not after the group's timeout.

Run as a script, this file is the rank program; pytest launches it.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

GROUP_T = datetime.timedelta(seconds=60)
CALL_T = 1.0


def _half_inputs(r, n, rows, dtype, salt=0):
    torch.manual_seed(1000 * salt + r)
    return ((torch.rand(rows, 1) * 2 - 1) * 65504 / n).to(dtype)


def c_half_sum_issue(pg, r, n):
    """The issue's code: allreduce vs. the local sum of the all_gathered values."""
    t = _half_inputs(r, n, 10, torch.float16)
    out = [[torch.zeros_like(t) for _ in range(n)]]
    f = pg.allgather(out, [t]).get_future()
    f.wait()
    total = torch.stack(f.value(), 0).sum(0)
    f = pg.allreduce([t]).get_future()
    f.wait()
    return [total, f.value()[0]]


def c_half_sums(pg, r, n):
    got = []
    for dtype in (torch.float16, torch.bfloat16):
        for rows in (1, 3, 10, 37, 200, 4001, 100003):
            t = _half_inputs(r, n, rows, dtype, salt=rows)
            pg.allreduce([t]).wait()
            got.append(t)
    return got


def c_half_multi_tensor_and_prod(pg, r, n):
    a, b = _half_inputs(r, n, 50, torch.float16, 1), _half_inputs(r, n, 50, torch.float16, 2)
    pg.allreduce([a, b]).wait()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.PRODUCT
    p = (torch.rand(64, generator=torch.Generator().manual_seed(r)) + 0.5).to(torch.bfloat16)
    pg.allreduce([p], opts).wait()
    return [a, b, p]


def _allgather_basics(pg, r, n, fn):
    """torch's test_c10d_gloo _test_allgather_basics: k inputs per rank."""
    got = []
    for k in (1, 2, 3):
        inputs = [fn(torch.tensor([k * r + i])) for i in range(k)]
        output = [[fn(torch.tensor([-1])) for _ in range(k * n)] for _ in range(k)]
        fut = pg.allgather(output, inputs).get_future()
        fut.wait()
        value = fut.value()
        got.append(("value", value))
        got.append(("output", output))
    return got


def c_allgather_multi_input(pg, r, n):
    return _allgather_basics(pg, r, n, lambda t: t.clone())


def c_allgather_noncontiguous(pg, r, n):
    got = _allgather_basics(pg, r, n, lambda t: t.expand(2, 2).contiguous()[:, 0])
    got += _allgather_basics(pg, r, n, lambda t: t.expand(2, 2).tril().contiguous()[:, 0])
    return got


def c_allgather_inference_mode(pg, r, n):
    with torch.inference_mode():
        got = _allgather_basics(pg, r, n, lambda t: t.clone())
    return got


CASES = {name[2:]: fn for name, fn in globals().items() if name.startswith("c_")}


def _same(a, b) -> bool:
    """Same structure (lists of lists of tensors, tuples) and same bits."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _shape(v):
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, (list, tuple)):
        return [_shape(x) for x in v]
    return v


def _call_timeout(pg, r, name, store):
    """Rank 0 calls, the others never do: the call must fail after about
    CALL_T (the group's timeout is 60 s). Every per-call form."""
    forms = []
    if r == 0:
        opts = dist.AllreduceOptions()
        opts.timeout = datetime.timedelta(seconds=CALL_T)
        forms.append(("allreduce opts", lambda: pg.allreduce([torch.ones(3)], opts).wait()))
        if name == "linkescape":
            # the keyword and barrier forms (Gloo's C++ binding has no keyword timeout on allreduce)
            forms.append(("allreduce timeout=", lambda: pg.allreduce(torch.ones(3), timeout=datetime.timedelta(
                seconds=CALL_T)).wait()))
            bopts = dist.BarrierOptions()
            bopts.timeout = datetime.timedelta(seconds=CALL_T)
            forms.append(("barrier opts", lambda: pg.barrier(bopts).wait()))
        out = []
        for form, call in forms:
            t0 = time.monotonic()
            try:
                call()
                out.append(f"{form}: completed")
            except Exception as exc:  # noqa: BLE001 - the timeout error is what we check
                took = time.monotonic() - t0
                out.append(f"{form}: {'timeout' if 0.8 * CALL_T <= took < 10 * CALL_T else f'took {took:.1f}s'}")
        store.set(f"{name}_timeout_done", "1")
        return out
    store.wait([f"{name}_timeout_done"], datetime.timedelta(seconds=120))
    return []


def main():
    from linkescape.torch.process_group import ProcessGroupLinkEscape

    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(os.environ["EXACT_STORE_FILE"], n)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, n, GROUP_T)
    le = ProcessGroupLinkEscape(dist.PrefixStore("le", store), r, n, GROUP_T)
    failed = []
    for name, fn in CASES.items():
        want = fn(gloo, r, n)
        try:
            got = fn(le, r, n)
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not _same(got, want):
            failed.append(f"{name}: got {_shape(got)} gloo {_shape(want)}"
                          + (f"\n  got {got}\n  gloo {want}" if len(repr(got)) < 2000 else ""))
    for name, pg in (("linkescape", le), ("gloo", gloo)):
        for line in _call_timeout(pg, r, name, store):
            if not line.endswith(": timeout"):
                failed.append(f"{name} per-call timeout: {line}")
    le.shutdown()
    if failed:
        raise SystemExit(f"rank {r}: {len(failed)} differ from gloo:\n" + "\n".join(failed))
    print(f"rank {r}: exact {len(CASES)} cases", flush=True)
    os._exit(0)  # the Gloo group timed out on purpose: do not wait for its teardown


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_results_are_gloos_bit_for_bit(nprocs, tmp_path):
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], nprocs, timeout=240, ok=f"exact {len(CASES)} cases",
              env={"EXACT_STORE_FILE": str(tmp_path / "store")})


if __name__ == "__main__":
    main()
