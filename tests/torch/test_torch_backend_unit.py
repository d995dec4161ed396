"""In-process tests of the torch backend: conversions, reduce-op mapping,
errors, and two ProcessGroupLinkEscape objects in one process (one thread
per rank) for quick checks of the staging paths."""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import threading

import pytest

from linkescape.config import Config
import torch
import torch.distributed as dist

import linkescape
from linkescape import ReduceOp
from linkescape.errors import CommTimeout, PeerLost, UnsupportedDtype, UsageError
from linkescape.torch import LinkEscapeBackendError, ProcessGroupLinkEscape, make_config
from linkescape.torch import convert
from linkescape.torch.work import LinkEscapeWork, wrap_error


# ------------------------------------------------------------------ conversions
def test_registered():
    assert "LINKESCAPE" in dist.Backend._plugins
    assert dist.Backend.backend_capability["linkescape"] == ["cpu", "cuda"]
    assert dist.Backend("linkescape") == "linkescape"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                   torch.uint8, torch.int32, torch.int64, torch.bool, torch.complex64])
def test_to_numpy_shares_memory(dtype):
    t = torch.zeros(5, dtype=dtype)
    a = convert.to_numpy(t)
    assert a.shape == (5,) and a.itemsize == t.element_size()
    a[2] = 1
    assert t[2].item() == 1
    if dtype == torch.bfloat16:
        assert a.dtype == linkescape.ops.BFLOAT16


def test_unsupported_dtype():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")
    with pytest.raises(UnsupportedDtype):
        convert.stage(torch.zeros(2, dtype=torch.float8_e4m3fn))


def test_reduce_op_mapping():
    R = dist.ReduceOp
    assert convert.reduce_op(R.SUM) is ReduceOp.SUM
    assert convert.reduce_op(R.PRODUCT) is ReduceOp.PROD
    assert convert.reduce_op(R.AVG) is ReduceOp.AVG
    for name in ("MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert convert.reduce_op(getattr(R, name)) is getattr(ReduceOp, name)
    opts = dist.AllreduceOptions()
    opts.reduceOp = R.MAX
    assert convert.reduce_op(opts.reduceOp) is ReduceOp.MAX
    with pytest.raises(UsageError, match="PREMUL_SUM"):
        convert.reduce_op(dist._make_nccl_premul_sum(2.0))


def test_staging_noncontiguous_roundtrip():
    base = torch.arange(12.0).reshape(3, 4)
    view = base.t()
    s = convert.stage(view)
    assert s.array.flags.c_contiguous and s.host.data_ptr() != base.data_ptr()
    s.array[...] *= 10
    s.write_back()
    assert torch.equal(base, torch.arange(12.0).reshape(3, 4) * 10)
    c = torch.arange(4.0)
    s = convert.stage(c)
    assert s.host.data_ptr() == c.data_ptr()


def test_seconds():
    assert convert.seconds(datetime.timedelta(seconds=3)) == 3
    assert convert.seconds(datetime.timedelta(milliseconds=-1), 7) == 7
    assert convert.seconds(None, 5) == 5
    assert convert.seconds(2500) == 2.5


def test_config_honours_torch_timeout(monkeypatch):
    monkeypatch.delenv("LINKESCAPE_TIMEOUT", raising=False)
    monkeypatch.delenv("LINKESCAPE_SILENT_TIMEOUT_MS", raising=False)
    cfg = make_config(12.0)
    assert cfg.timeout == 12.0 and cfg.connect_timeout == 12.0
    # silent-loss detection reads kernel acks, so torch jobs keep the library default
    assert cfg.silent_timeout == Config().silent_timeout
    monkeypatch.setenv("LINKESCAPE_TIMEOUT", "42")
    assert make_config(dist.constants.default_pg_timeout.total_seconds()).timeout == 42.0
    assert make_config(12.0).timeout == 12.0
    monkeypatch.setenv("LINKESCAPE_SILENT_TIMEOUT_MS", "300")
    assert make_config(12.0).silent_timeout == 0.3


def test_error_class():
    cause = PeerLost("rank 2 closed every link", peer=2)
    exc = wrap_error(cause, "all_reduce", 0, "7", [0, 5, 9])
    assert isinstance(exc, dist.DistBackendError) and isinstance(exc, RuntimeError)
    assert exc.cause is cause and exc.__cause__ is cause
    assert exc.peer == 2 and exc.global_peer == 9
    assert "peer rank 2, global rank 9" in str(exc)
    t = CommTimeout("x", peers=[1])
    assert wrap_error(t, "barrier", 0).peer == 1


def test_work_future_carries_error():
    w = LinkEscapeWork("x", [], [torch.ones(1)])
    assert w.is_completed() and w.is_success()
    assert torch.equal(w.get_future().wait()[0], torch.ones(1))

    class FailedPart:
        def add_done_callback(self, fn):
            fn(self)

        def exception(self):
            return PeerLost("gone", peer=1)

        def is_completed(self):
            return True

        def wait(self, timeout=None):
            raise self.exception()

    w = LinkEscapeWork("all_reduce", [FailedPart()], [torch.ones(1)], rank=0)
    with pytest.raises(LinkEscapeBackendError) as info:
        w.wait()
    assert isinstance(info.value.cause, PeerLost)
    with pytest.raises(dist.DistBackendError):
        w.get_future().wait()
    assert not w.is_success() and isinstance(w.exception(), LinkEscapeBackendError)


def test_a_wait_without_timeout_outlasts_a_part_whose_callbacks_still_run():
    """The library marks an operation done, then runs its callbacks (on the progress thread when it
    completed there). A caller's wait(), finding every part done while the work's own count was not in
    yet, waited 0 s for the rest and raised CommTimeout "not complete after None s" (seen in the
    memory benchmark: torch reduce_scatter 4M under load)."""
    import threading

    class LateCallbacks:
        """Done at once; its callbacks run 0.3 s later, from another thread."""

        def __init__(self):
            self.fns = []

        def add_done_callback(self, fn):
            self.fns.append(fn)
            threading.Timer(0.3, lambda: [f(self) for f in self.fns]).start()

        def exception(self):
            return None

        def is_completed(self):
            return True

        def done_within(self, timeout):
            return True

    w = LinkEscapeWork("reduce_scatter_tensor", [LateCallbacks(), LateCallbacks()], [torch.ones(1)], rank=0)
    assert w.wait() is True
    assert w.is_completed() and w.is_success()


# ------------------------------------------------------------------ two ranks, one process
@pytest.fixture(scope="module")
def pair():
    store = dist.HashStore()
    with cf.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(ProcessGroupLinkEscape, dist.PrefixStore("unit/", store), r, 2,
                          datetime.timedelta(seconds=20), group_name="unit") for r in range(2)]
        pgs = [f.result(timeout=30) for f in futs]
    yield pgs
    for pg in pgs:
        pg.shutdown()


def both(pgs, fn):
    """Run ``fn(pg, rank)`` on both ranks at once; returns the results."""
    with cf.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(fn, pg, r) for r, pg in enumerate(pgs)]
        return [f.result(timeout=30) for f in futs]


def test_pair_identity(pair):
    assert pair[0].getBackendName() == "linkescape"
    assert pair[1].rank() == 1 and pair[1].size() == 2
    assert pair[0].getGroupName() == "unit"
    pair[0].setGroupDesc("desc")
    assert pair[0].getGroupDesc() == "desc"
    info = pair[0]._get_backend(torch.device("cpu"))
    assert not info.supports_splitting and not info.supports_coalescing and info.name() == "linkescape"


def test_pair_allreduce_staged(pair):
    def run(pg, r):
        base = torch.zeros(4, 6)
        view = base[:, ::3]
        view.fill_(r + 1)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        pg.allreduce([view], opts).wait()
        return base

    for base in both(pair, run):
        assert torch.equal(base[:, ::3], torch.full((4, 2), 3.0))
        assert base.sum().item() == 24.0


def test_pair_bf16_avg(pair):
    def run(pg, r):
        t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16) * (r + 1)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([t], opts).wait()
        return t

    for t in both(pair, run):
        assert torch.equal(t, torch.tensor([1.5, 3.0, 4.5], dtype=torch.bfloat16))


def test_pair_uneven_all_to_all_single(pair):
    def run(pg, r):
        inp = torch.arange(5.0) + 10 * r
        split_in = [2, 3] if r == 0 else [1, 4]
        split_out = [2, 1] if r == 0 else [3, 4]
        out = torch.empty(sum(split_out))
        pg.all_to_all_single(out, inp, split_out, split_in, dist.AllToAllOptions()).wait()
        return out

    a, b = both(pair, run)
    assert a.tolist() == [0.0, 1.0, 10.0]
    assert b.tolist() == [2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0]


def test_pair_coalescing_and_future(pair):
    def run(pg, r):
        pg._start_coalescing(torch.device("cpu"))
        a, b = torch.ones(3) * r, torch.ones(2) * (r + 5)
        pg.allreduce([a])
        pg.allreduce([b])
        work = pg._end_coalescing(torch.device("cpu"))
        work.wait()
        got = work.get_future().wait()
        return a, b, len(got)

    for a, b, n in both(pair, run):
        assert torch.equal(a, torch.ones(3)) and torch.equal(b, torch.full((2,), 11.0)) and n == 2


def test_pair_wait_timeout_then_complete(pair):
    def run(pg, r):
        if r == 0:
            buf = torch.empty(2)
            w = pg.recv([buf], 1, 5)
            with pytest.raises(LinkEscapeBackendError, match="CommTimeout"):
                w.wait(datetime.timedelta(milliseconds=200))
            assert not w.is_completed()
            ready.set()
            w.wait()
            return buf
        ready.wait(10)
        pg.send([torch.tensor([4.0, 2.0])], 0, 5).wait()
        return None

    ready = threading.Event()
    buf, _ = both(pair, run)
    assert buf.tolist() == [4.0, 2.0]


# ------------------------------------------------------------------ init: a barrier only when start-up was none
@pytest.mark.parametrize("mode", ["all", "neighbours"])
def test_init_is_a_barrier_once(monkeypatch, mode):
    """Gloo's constructor acts as a barrier; so does ours. A start-up that ended at the store barrier
    (neighbours: from 16 ranks on) is that barrier: a collective one after it waited for the links
    Recovery opens afterwards (32 ranks on 2 cores: init 0.5 s longer than Gloo's)."""
    calls = []
    barrier = linkescape.Communicator.barrier

    def counted(self, *a, **k):
        calls.append(self.rank)
        return barrier(self, *a, **k)

    monkeypatch.setattr(linkescape.Communicator, "barrier", counted)
    store = dist.HashStore()
    cfg = Config(timeout=20, connect_timeout=20, connect_at_start=mode)
    with cf.ThreadPoolExecutor(3) as ex:
        futs = [ex.submit(ProcessGroupLinkEscape, dist.PrefixStore(f"init-{mode}/", store), r, 3,
                          datetime.timedelta(seconds=20), group_name=mode, config=cfg) for r in range(3)]
        pgs = [f.result(timeout=60) for f in futs]
    try:
        together = [pg.communicator.started_together for pg in pgs]
        assert together == [mode == "neighbours"] * 3
        assert sorted(calls) == ([] if mode == "neighbours" else [0, 1, 2])

        def run(pg, r):
            t = torch.full((4,), float(r))
            pg.allreduce([t]).wait()
            return t.tolist()

        with cf.ThreadPoolExecutor(3) as ex:  # the group works, its other links opened after init
            outs = [f.result(timeout=30) for f in [ex.submit(run, pg, r) for r, pg in enumerate(pgs)]]
        assert outs == [[3.0] * 4] * 3
    finally:
        for pg in pgs:
            pg.shutdown()
