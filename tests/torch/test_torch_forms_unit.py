"""In-process tests of the argument forms (split sizes from any sequence,
options or bare values) and of completion under the caller's grad and
inference modes."""

from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

from linkescape.errors import UsageError
from linkescape.torch import args
from linkescape.torch.work import LinkEscapeWork


@pytest.mark.parametrize("value", [[1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), np.array([1, 2, 3], np.int32),
                                   torch.tensor([1, 2, 3]), range(1, 4), [np.int64(1), 2, 3]])
def test_split_sizes_any_sequence(value):
    assert args.split_sizes(value, "x") == [1, 2, 3]


def test_split_sizes_empty_means_even():
    assert args.split_sizes(None, "x") == []
    assert args.split_sizes(np.array([], np.int64), "x") == []
    assert args.split_sizes((), "x") == []


@pytest.mark.parametrize("bad", [[1.5, 2], [-1, 2], 3, ["a"], [True, 1]])
def test_split_sizes_refused(bad):
    with pytest.raises(UsageError):
        args.split_sizes(bad, "x")


def test_root_and_op_forms():
    opts = dist.BroadcastOptions()
    opts.rootRank = 2
    assert args.root_of(opts) == 2 and args.root_of(None) == 0 and args.root_of(None, 3) == 3
    assert args.root_of(1) == 1 and args.root_of(np.int64(1)) == 1
    red = dist.ReduceOptions()
    red.reduceOp = dist.ReduceOp.MAX
    assert args.reduce_op_of(red) == dist.ReduceOp.MAX
    assert args.reduce_op_of(dist.ReduceOp.MIN) == dist.ReduceOp.MIN
    assert args.reduce_op_of(None) == dist.ReduceOp.SUM
    assert args.reduce_op_of(red, dist.ReduceOp.PRODUCT) == dist.ReduceOp.PRODUCT
    with pytest.raises(UsageError):
        args.root_of("0")
    assert args.timeout_of(None, datetime.timedelta(seconds=2)) == 2
    assert args.timeout_of(datetime.timedelta(seconds=3)) == 3
    assert args.timeout_of(None) is None


def test_tensor_list():
    t = torch.ones(1)
    assert args.tensor_list(t, "x") == [t]
    assert args.tensor_list((t, t), "x") == [t, t]
    with pytest.raises(UsageError):
        args.tensor_list([t, 3], "x")


class _Part:
    """A library Work stand-in completed from another thread."""

    def __init__(self):
        self._done = threading.Event()
        self._cbs = []

    def add_done_callback(self, fn):
        self._cbs.append(fn)

    def complete(self):
        self._done.set()
        for fn in self._cbs:
            fn(self)

    def exception(self):
        return None

    def is_completed(self):
        return self._done.is_set()

    def wait(self, timeout=None):
        self._done.wait(timeout)
        return True


@pytest.mark.parametrize("mode", ["inference", "no_grad", "grad"])
def test_finish_runs_under_callers_mode(mode):
    seen = {}
    part = _Part()

    def finish():
        seen["grad"] = torch.is_grad_enabled()
        seen["inference"] = torch.is_inference_mode_enabled()

    ctx = {"inference": torch.inference_mode(), "no_grad": torch.no_grad(), "grad": torch.enable_grad()}[mode]
    with ctx:
        want = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        work = LinkEscapeWork("x", [part], [], finish)
    # completed from another thread (as the library's progress thread does);
    # the completer thread then runs the finish step
    threading.Thread(target=part.complete).start()
    work.wait(datetime.timedelta(seconds=10))
    assert (seen["grad"], seen["inference"]) == want


def test_inference_tensor_written_on_completer_thread():
    part = _Part()
    with torch.inference_mode():
        out = torch.zeros(3)
        src = torch.ones(3)
        work = LinkEscapeWork("x", [part], [out], lambda: out.copy_(src))
    threading.Thread(target=part.complete).start()
    work.wait()
    assert out.tolist() == [1.0, 1.0, 1.0]
