"""linkescape bench: records, correctness checks, bus-bandwidth formulas, usage errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from linkescape.bench.cases import Case, count_wrong, reduce_tiles
from linkescape.bench.cli import bench
from linkescape.bench.report import format_medians, median_table
from linkescape.bench.spec import SpecError, layout, parse_ops, parse_size, parse_sizes

HAVE_TORCH = True
try:  # noqa: SIM105
    import importlib.util

    HAVE_TORCH = importlib.util.find_spec("torch") is not None
except Exception:  # noqa: BLE001
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="gloo needs torch")

KEYS = {"op", "backend", "world_size", "size", "count", "type", "time_us", "time_us_mean", "time_us_min",
        "time_us_max", "algbw", "busbw", "busbw_factor", "wrong", "iters", "warmup", "rails", "times_us"}


def expected_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def run_bench(args, tmp_path, name="out.jsonl"):
    path = tmp_path / name
    result = CliRunner().invoke(bench, [*args, "--json", str(path), "--timeout", "60"], catch_exceptions=False)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return result, records


def check_records(records, ops, backends, n, sizes=None):
    assert records, "no records written"
    for r in records:
        assert KEYS <= set(r), set(KEYS) - set(r)
        assert r["world_size"] == n
        assert r["backend"] in backends
        assert r["type"] == "float32"
        assert r["wrong"] == 0, r
        assert len(r["times_us"]) == r["iters"]
        # the reported time is the median of the per-iteration slowest-rank times
        assert math.isclose(r["time_us"], statistics.median(r["times_us"]), rel_tol=1e-3, abs_tol=1e-3)
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
        assert r["time_us"] > 0
        if r["op"] == "barrier":
            assert r["size"] == 0 and r["busbw"] == 0
            continue
        assert r["size"] == r["count"] * 4
        assert math.isclose(r["algbw"], r["size"] / (r["time_us"] * 1e-6) / 1e9, rel_tol=1e-9)
        assert math.isclose(r["busbw_factor"], expected_factor(r["op"], n))
        assert math.isclose(r["busbw"], r["algbw"] * expected_factor(r["op"], n), rel_tol=1e-9)
    seen = {(r["op"], r["backend"]) for r in records}
    assert seen == {(o, b) for o in ops for b in backends}
    if sizes is not None:
        for o in ops:
            for b in backends:
                got = [r["requested_size"] for r in records if r["op"] == o and r["backend"] == b]
                assert got == sizes


# ---------------------------------------------------------------- end to end
@needs_torch
def test_both_backends_all_reduce_all_gather(tmp_path):
    sizes = [4, 64, 1024, 16384]
    result, records = run_bench(["all_reduce,all_gather", "--sizes", "4:64K", "--factor", "16", "--world-size", "2",
                                 "--backend", "linkescape,gloo", "--iters", "3", "--warmup", "1"], tmp_path)
    assert result.exit_code == 0, result.output
    check_records(records, ["all_reduce", "all_gather"], ["linkescape", "gloo"], 2, sizes)
    out = result.output
    assert "#       size         count      type     time   algbw   busbw  #wrong" in out
    assert "tcp_congestion_control" in out and "world_size: 2" in out and "rails: 127.0.0.1" in out
    assert "linkescape/gloo" in out and "Out of bounds values : 0 OK" in out
    # nccl-tests size conventions: all_gather reports its output buffer
    ag = [r for r in records if r["op"] == "all_gather" and r["requested_size"] == 64]
    assert all(r["size"] == 64 and r["count"] == 16 for r in ag)
    ag4 = [r for r in records if r["op"] == "all_gather" and r["requested_size"] == 4]
    assert all(r["size"] == 8 for r in ag4)  # one element per rank at least


@needs_torch
def test_all_ops_three_ranks(tmp_path):
    result, records = run_bench(["all", "--sizes", "4,4K", "--world-size", "3", "--backend", "linkescape,gloo",
                                 "--iters", "2", "--warmup", "0"], tmp_path)
    assert result.exit_code == 0, result.output
    ops = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
           "send_recv", "barrier"]
    check_records(records, ops, ["linkescape", "gloo"], 3)
    rs = [r for r in records if r["op"] == "reduce_scatter" and r["requested_size"] == 4096]
    assert all(r["size"] == 4092 for r in rs)  # 341 elements per rank, the input of 3 blocks


def test_linkescape_alone_with_file_store_and_two_rails(tmp_path):
    result, records = run_bench(["broadcast", "--sizes", "4:1M", "--factor", "64", "--world-size", "2",
                                 "--rails", "127.0.0.1,127.0.0.2", "--store", "file", "--dtype", "float32",
                                 "--iters", "2", "--warmup", "0"], tmp_path)
    assert result.exit_code == 0, result.output
    check_records(records, ["broadcast"], ["linkescape"], 2, [4, 256, 16384, 1048576])
    assert all(r["rails"] == ["127.0.0.1", "127.0.0.2"] for r in records)
    assert "linkescape/gloo" not in result.output


# ---------------------------------------------------------------- usage and failures
@pytest.mark.parametrize("args, text", [
    (["all_reduse"], "unknown operation"),
    (["all_reduce", "--sizes", "4:abc"], "is not a size"),
    (["all_reduce", "--sizes", "64K:4"], "larger than MAX"),
    (["all_reduce", "--sizes", "0:4"], "must be positive"),
    (["all_reduce", "--factor", "1"], "greater than 1"),
    (["all_reduce", "--backend", "nccl"], "unknown backend"),
    (["send_recv", "--world-size", "1"], "at least 2 ranks"),
    (["all_reduce", "--dtype", "float128"], "float128"),
    (["all_reduce", "--world-size", "2", "--root", "5"], "root 5"),
])
def test_usage_errors(args, text):
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 2, result.output
    assert text in result.output
    assert "Traceback" not in result.output


def test_faults_option_rejects_unknown_kinds():
    # (the failover benchmark itself runs in tests/bench/test_failover_bench.py)
    result = CliRunner().invoke(bench, ["--faults", "meteor"])
    assert result.exit_code == 2, result.output
    assert "--faults" in result.output


def test_rank_failure_stops_everything_with_a_clear_message():
    # 192.0.2.1 (TEST-NET-1) is no local address: every rank fails to listen on it
    result = CliRunner().invoke(bench, ["all_reduce", "--sizes", "4", "--rails", "192.0.2.1", "--timeout", "20",
                                        "--store", "file"])
    assert result.exit_code == 1, result.output
    error = result.output[result.output.index("Error:"):]
    assert "rank" in error and "192.0.2.1" in error
    assert "Traceback" not in result.output


def test_console_script_runs_bench(tmp_path):
    exe = shutil.which("linkescape", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the linkescape console script is not installed")
    proc = subprocess.run([exe, "bench", "barrier", "--world-size", "2", "--iters", "2", "--warmup", "0",
                           "--timeout", "30"], capture_output=True, text=True, timeout=120)
    if "No such command 'bench'" in proc.stderr:
        pytest.skip(f"linkescape CLI does not register bench yet: {proc.stderr.splitlines()[0]}")
    assert proc.returncode == 0, proc.stderr
    assert "# barrier" in proc.stdout


# ---------------------------------------------------------------- units
def test_sizes():
    assert parse_size("4") == 4 and parse_size("64K") == 65536 and parse_size("256M") == 256 << 20
    assert parse_size("1G") == 1 << 30 and parse_size("64KiB") == 65536 and parse_size("1.5K") == 1536
    assert parse_sizes("4:64K") == [4 << i for i in range(15)]
    assert parse_sizes("4:64", 4) == [4, 16, 64]
    assert parse_sizes("16M,64M,256M") == [16 << 20, 64 << 20, 256 << 20]
    assert parse_sizes("1:4", 1.5) == [1, 2, 3, 4]
    for bad in ("", "x", "4:", "1:2:3", "-4", "1.5"):
        with pytest.raises(SpecError):
            parse_sizes(bad)
    assert parse_ops("allreduce,all-gather") == ["all_reduce", "all_gather"]
    assert len(parse_ops("all")) == 10
    assert layout("all_gather", 64, 4, 3) == (60, 15, 5)
    assert layout("all_reduce", 6, 4, 3) == (4, 1, 1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "uint8", "int64"])
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
def test_case_expectations_are_exact(dtype, redop):
    """Simulate the collectives in numpy: the expectations hold and a corrupted
    element is counted."""
    n = 3
    cases = [Case("all_reduce", r, n, 1000, dtype, redop) for r in range(n)]
    bufs = [c.arrays["buf"].copy() for c in cases]
    acc = bufs[0].astype(np.float64 if cases[0].dtype.kind == "f" or dtype == "bfloat16" else np.int64)
    for b in bufs[1:]:
        x = b.astype(acc.dtype)
        acc = {"sum": acc + x, "prod": acc * x, "min": np.minimum(acc, x), "max": np.maximum(acc, x)}[redop]
    for c in cases:
        c.arrays["buf"][...] = acc.astype(c.dtype) if c.dtype.kind == "f" or dtype == "bfloat16" else \
            (acc.astype(np.int64).astype(c.dtype))
        assert c.check() == 0
    cases[0].arrays["buf"][7] += 1
    assert cases[0].check() == 1

    rs = [Case("reduce_scatter", r, n, 999, dtype, redop) for r in range(n)]
    for k, c in enumerate(rs):
        blocks = [o.arrays["inp"][k].astype(np.float64) for o in rs]
        res = blocks[0]
        for b in blocks[1:]:
            res = {"sum": res + b, "prod": res * b, "min": np.minimum(res, b), "max": np.maximum(res, b)}[redop]
        c.arrays["out"][...] = (res.astype(np.int64) % 256).astype(c.dtype) if dtype in ("int8", "uint8") else \
            res.astype(c.dtype)
        assert c.check() == 0


def test_data_movement_cases_catch_misplaced_blocks():
    n = 4
    ag = [Case("all_gather", r, n, 4096, "float32") for r in range(n)]
    full = np.stack([c.arrays["inp"] for c in ag])
    for c in ag:
        c.arrays["out"][...] = full
        assert c.check() == 0
    ag[1].arrays["out"][[0, 1]] = full[[1, 0]]  # two blocks swapped
    assert ag[1].check() == 2 * ag[1].block
    a2a = [Case("all_to_all", r, n, 4096, "int32") for r in range(n)]
    for r, c in enumerate(a2a):
        c.arrays["out"][...] = np.stack([a2a[s].arrays["inp"][r] for s in range(n)])
        assert c.check() == 0
    bc = [Case("broadcast", r, n, 100, "float16", root=2) for r in range(n)]
    assert bc[2].check() == 0 and bc[0].check() == bc[0].count  # non-roots still hold zeros


def test_reduce_tiles_wraps_integers():
    t = np.array([100, 127], np.int8)
    assert reduce_tiles([t, t], "sum", 2, np.dtype(np.int8)).tolist() == [-56, -2]
    assert count_wrong(np.arange(10, dtype=np.float32), np.arange(10, dtype=np.float32)) == 0


def test_median_report():
    def rec(backend, size, t, run):
        return {"op": "all_reduce", "backend": backend, "world_size": 2, "type": "float32", "size": size,
                "time_us": t, "busbw_factor": 1.0, "busbw": size / t / 1e3, "wrong": 0, "run": run}
    runs = [[rec("linkescape", 1 << 20, t1, i), rec("gloo", 1 << 20, t2, i)]
            for i, (t1, t2) in enumerate([(100, 200), (300, 200), (150, 100)])]
    rows = median_table(runs)
    assert len(rows) == 1
    row = rows[0]
    assert row["linkescape"]["time_us"] == 150 and row["gloo"]["time_us"] == 200
    assert row["time_ratio"] == 1.5  # median of the side-by-side ratios 0.5, 1.5, 1.5
    text = format_medians(rows, markdown=True)
    assert "| all_reduce | 2 | 1 MiB |" in text
