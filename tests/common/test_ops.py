"""linkescape.ops: which dtypes reduce, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from linkescape import ops


def test_importing_linkescape_does_not_import_ml_dtypes():
    # ml_dtypes costs ~1.2 s of CPU to import: every rank of a numpy-only job paid it at start
    code = ("import sys, linkescape, linkescape.communicator, linkescape.testbed.exact\n"
            "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'\n"
            "import numpy as np\n"
            "from linkescape import ops\n"
            "assert ops.is_half(np.dtype(np.float16)) and not ops.is_half(np.dtype('V2'))\n"
            "assert 'ml_dtypes' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_bfloat16_is_a_half_type_once_asked_for():
    bf16 = ops.bfloat16()
    assert bf16 is not None and bf16.name == "bfloat16" and ops.BFLOAT16 == bf16
    assert ops.is_half(bf16) and ops.supported_dtype(bf16)
    assert not ops.is_half(np.dtype(np.float32)) and ops.supported_dtype(np.dtype(np.int8))


def test_half_reducers_are_kept_one_per_op_and_dtype_whatever_the_shapes():
    """Random shapes (the chaos workload's) once made one reducer with scratch of
    its own per op, dtype and power of two: the cache grew for an hour."""
    import tracemalloc

    ops._REDUCERS.clear()
    f16 = np.dtype(np.float16)
    ops.reducer(ops.ReduceOp.SUM, f16, 1)(np.zeros(1, f16), np.ones(1, f16), np.ones(1, f16))  # the thread's scratch
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(1, 1 << 15, 97):
            for op in (ops.ReduceOp.SUM, ops.ReduceOp.MAX):
                ops.reducer(op, f16, n)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert set(ops._REDUCERS) == {(ops.ReduceOp.SUM, f16), (ops.ReduceOp.MAX, f16)}
    assert kept < 16 << 10, kept  # two small closures, no scratch


def test_threads_reducing_half_values_at_once_do_not_share_scratch():
    """Two communicators in one process reduce on their own threads at once; a
    cached half reducer is shared by both, its scratch is not."""
    import threading

    f16 = np.dtype(np.float16)
    red = ops.reducer(ops.ReduceOp.SUM, f16, 1 << 15)
    wrong = []

    def work(k: int) -> None:
        a = np.full(1 << 15, k, f16)
        b = np.full(1 << 15, 1, f16)
        out = np.empty_like(a)
        for _ in range(300):
            red(out, a, b)
            if not (out == k + 1).all():
                wrong.append(k)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in (2, 5, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
