"""``linkescape bench --backend floor``: the bare Python all_reduce the others are judged by moves the
bytes in linkescape's shapes, gets exact results at every size and world size, and runs beside the
others in the benchmark's table."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from linkescape.algorithms import latency
from linkescape.bench.cli import bench
from linkescape.bench.floor import FloorBackend, _doubling, _knomial


@pytest.mark.parametrize("radix", [2, 3, 4, 8, 9])
def test_the_floor_takes_linkescapes_shapes(radix):
    for n in range(1, 70):
        for r in range(n):
            parent, children = latency._tree(n, r, 0, radix)
            assert _knomial(n, r, radix) == (parent, list(children)), (n, r)
            if radix == 2:
                assert _doubling(n, r) == (lambda p2, extra, steps: (p2, extra, list(steps)))(
                    *latency._doubling(n, r))


class _Store:
    def __init__(self) -> None:
        self.data = {}
        self.cond = threading.Condition()

    def set(self, key, value) -> None:
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=30), key
            return self.data[key]


def _world(n: int):
    store, out, errors = _Store(), [None] * n, []

    def make(r):
        try:
            out[r] = FloorBackend(store, r, n, "127.0.0.1", 30.0)
        except Exception as exc:  # noqa: BLE001 - shown by the assertion below
            errors.append(exc)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def _run_all(calls):
    errors = []

    def one(c):
        try:
            c()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a floor call hung"
    assert not errors, errors


@pytest.mark.parametrize("n,tree_ranks", [(1, 16), (2, 16), (3, 16), (5, 16), (8, 16), (6, 4), (17, 16)])
@pytest.mark.parametrize("nbytes", [4, 4096, 256 << 10])  # doubling or the tree up to 64 KiB, the ring above
def test_every_rank_gets_the_exact_sum(monkeypatch, n, tree_ranks, nbytes):
    monkeypatch.setenv("LINKESCAPE_TREE_RANKS", str(tree_ranks))
    monkeypatch.setenv("LINKESCAPE_TREE_RADIX", "4")
    ranks = _world(n)
    try:
        count = nbytes // 4
        bufs = [np.arange(count, dtype=np.float32) % 1000 + 7 * r for r in range(n)]
        want = sum(np.arange(count, dtype=np.float32) % 1000 + 7 * r for r in range(n))
        calls = [b._all_reduce({"buf": buf}, 0, "sum", r) for r, (b, buf) in enumerate(zip(ranks, bufs))]
        for _ in range(2):  # twice: nothing of one call leaks into the next
            for buf, r in zip(bufs, range(n)):
                buf[:] = np.arange(count, dtype=np.float32) % 1000 + 7 * r
            _run_all(calls)
            for buf in bufs:
                assert np.array_equal(buf, want)
        _run_all([b.barrier for b in ranks])
    finally:
        for b in ranks:
            b.close()


def test_the_floor_runs_beside_linkescape_in_the_table(tmp_path):
    path = tmp_path / "out.jsonl"
    result = CliRunner().invoke(bench, ["all_reduce", "--sizes", "4,256K", "--world-size", "3", "--backend",
                                        "linkescape,floor", "--iters", "3", "--warmup", "1", "--isolated",
                                        "--json", str(path), "--timeout", "60"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    floor = [r for r in records if r["backend"] == "floor"]
    assert {r["size"] for r in floor} == {4, 256 << 10}
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["cpu_us"] > 0 for r in floor)
    assert "linkescape/floor" in result.output  # the ratio columns


def test_what_the_floor_does_not_run_is_a_usage_error():
    result = CliRunner().invoke(bench, ["broadcast", "--backend", "linkescape,floor"])
    assert result.exit_code != 0 and "backend floor runs all_reduce, barrier, send_recv only" in result.output
    result = CliRunner().invoke(bench, ["all_reduce", "--backend", "floor", "--op", "avg"])
    assert result.exit_code != 0 and "backend floor: reduction avg" in result.output
