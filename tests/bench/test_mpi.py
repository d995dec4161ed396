"""linkescape bench --backend linkescape,gloo,mpi: Open MPI's job beside the ranks (real mpirun, real
TCP on loopback, 2 ranks, a few calls), --isolated, the per call context switches, and the one-line
message when Open MPI is missing."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import sys
import time

import pytest
from click.testing import CliRunner

from linkescape.bench import mpi
from linkescape.bench.cli import bench
from linkescape.bench.runner import BenchError

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="gloo needs torch")


def _mpi_or_none():
    try:
        return mpi.find()
    except mpi.MpiUnavailable as exc:
        return str(exc)


FOUND = _mpi_or_none()
needs_mpi = pytest.mark.skipif(isinstance(FOUND, str), reason=f"no Open MPI here ({FOUND}); `make mpi` installs it")


def run_bench(args, tmp_path, name="out.jsonl", env=None, timeout=60):
    path = tmp_path / name
    result = CliRunner().invoke(bench, [*args, "--json", str(path), "--timeout", str(timeout)],
                                catch_exceptions=False, env=env)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return result, records


@needs_mpi
@needs_torch
def test_three_backends_side_by_side_every_op(tmp_path):
    result, records = run_bench(["all", "--sizes", "64K", "--world-size", "2", "--backend", "linkescape,gloo,mpi",
                                 "--iters", "3", "--warmup", "1"], tmp_path)
    assert result.exit_code == 0, result.output
    ops = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
           "send_recv", "barrier"}
    got = {(r["op"], r["backend"], r["size"]) for r in records}
    for op in ops:
        for backend in ("linkescape", "gloo", "mpi"):
            assert any(o == op and b == backend for o, b, _s in got), (op, backend)
    for r in records:
        if r["backend"] != "mpi":
            continue
        assert r["world_size"] == 2 and r["iters"] == 3 and len(r["times_us"]) == 3
        assert r["time_us"] > 0 and r["isolated"] is False
        # Open MPI gets the same buffers and the same check as the others
        assert r["wrong"] == 0, r
        assert r["library"].startswith("Open MPI")
        assert r["cpu_us"] > 0 and r["vcsw"] >= 0 and r["ivcsw"] >= 0 and len(r["vcsw_per_rank"]) == 2
        assert math.isclose(r["time_us"], statistics.median(r["times_us"]), rel_tol=1e-3, abs_tol=1e-3)
    # one row per (op, size) with the three, and the linkescape/mpi ratios in the table
    lines = result.output.splitlines()
    assert any("linkescape/gloo" in line and "linkescape/mpi" in line for line in lines)
    assert "# linkescape/mpi per op:" in result.output
    sizes = [r for r in records if r["op"] == "all_reduce"]
    assert [r["backend"] for r in sizes] == ["linkescape", "gloo", "mpi"]


@needs_mpi
def test_mpi_alone_isolated_three_ranks(tmp_path, monkeypatch):
    turns = []
    ask = mpi.MpiLauncher._ask

    def recording(self, who):
        turns.append((self.step, who))
        ask(self, who)
    monkeypatch.setattr(mpi.MpiLauncher, "_ask", recording)
    result, records = run_bench(["all_reduce,all_gather", "--sizes", "4,64K", "--world-size", "3", "--backend", "mpi",
                                 "--iters", "4", "--warmup", "1", "--isolated"], tmp_path)
    assert result.exit_code == 0, result.output
    assert len(records) == 4 and {r["backend"] for r in records} == {"mpi"}
    for r in records:
        assert r["isolated"] is True and r["world_size"] == 3 and r["wrong"] == 0
        assert len(r["cpu_us_per_rank"]) == 3 and all(c > 0 for c in r["cpu_us_per_rank"])
    assert "(isolated: each call after a barrier)" in result.output
    # the two jobs take turns, alternating which goes first from one step to the next
    assert turns == [(0, "ranks"), (0, "mpi"), (1, "mpi"), (1, "ranks"), (2, "ranks"), (2, "mpi"), (3, "mpi"),
                     (3, "ranks")]


def _debians_mpi4py() -> bool:
    """The system Python imports Debian's python3-mpi4py (not one pip put there: CI's system Python
    once had an mpi4py of unknown origin whose job never started)."""
    import subprocess

    try:
        out = subprocess.run([mpi.SYSTEM_PYTHON, "-c", "import mpi4py; print(mpi4py.__file__)"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.startswith("/usr/lib/python3/dist-packages/") \
        and mpi._imports(mpi.SYSTEM_PYTHON)


@needs_mpi
@pytest.mark.skipif(not _debians_mpi4py(), reason=f"{mpi.SYSTEM_PYTHON} has no Debian mpi4py and numpy "
                    "(apt-get install python3-mpi4py python3-numpy)")
def test_debians_mpi4py_with_the_system_python(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi, "_python_for_mpi", lambda _executable: mpi.SYSTEM_PYTHON)
    # --timeout 20: a job that does not start or answer is the launcher's error (start 35 s, a step 95 s),
    # well before pytest's 300 s
    result, records = run_bench(["all_reduce", "--sizes", "4", "--world-size", "2", "--backend", "mpi", "--iters", "2",
                                 "--warmup", "0"], tmp_path, timeout=20)
    assert result.exit_code == 0, result.output
    assert len(records) == 1 and records[0]["backend"] == "mpi" and records[0]["time_us"] > 0
    # its ranks check the results when that Python can import this linkescape, N/A otherwise
    assert records[0]["wrong"] in (0, None)


@needs_torch
def test_isolated_calls_and_context_switches_of_the_python_backends(tmp_path):
    result, records = run_bench(["all_reduce", "--sizes", "4,1M", "--world-size", "2", "--backend", "linkescape,gloo",
                                 "--iters", "5", "--warmup", "1", "--isolated"], tmp_path)
    assert result.exit_code == 0, result.output
    assert len(records) == 4
    for r in records:
        assert r["isolated"] is True and len(r["times_us"]) == 5 and r["wrong"] == 0
        assert r["cpu_us"] > 0 and len(r["cpu_us_per_rank"]) == 2
        assert r["vcsw"] >= 0 and r["ivcsw"] >= 0 and len(r["ivcsw_per_rank"]) == 2
        assert 0 < r["caller_cpu_us"] <= r["cpu_us"] * 1.001 + 1 and r["caller_vcsw"] <= r["vcsw"]
    # Gloo's threads block on their sockets: a 1 MiB exchange sleeps and wakes at least once a call
    big = [r for r in records if r["backend"] == "gloo" and r["size"] == 1 << 20][0]
    assert big["vcsw"] >= 1, big
    assert "--isolated" in result.output.splitlines()[0]


def _fake_mpirun(tmp_path, body):
    script = tmp_path / "mpirun"
    script.write_text(f"#!{sys.executable}\nimport json, sys, time\n{body}\n")
    os.chmod(script, 0o755)
    return {"mpirun": str(script), "python": sys.executable}


def _launch(tmp_path, found, monkeypatch, timeout=1.0, backends=("linkescape", "mpi")):
    from linkescape.bench.spec import BenchSpec

    monkeypatch.setattr(mpi, "WATCHDOG_GRACE", 0.5)
    spec = BenchSpec(ops=["all_reduce"], sizes=[4], world_size=2, backends=list(backends), iters=1, warmup=0,
                     timeout=timeout)
    launcher = mpi.MpiLauncher(spec, lambda ev: None, found=found)
    t0 = time.monotonic()
    with pytest.raises(BenchError) as info:
        launcher.run()
    assert not launcher.procs or all(p.poll() is not None for p in launcher.procs.values())
    assert launcher.mpi.poll() is not None  # nothing left running
    return str(info.value), time.monotonic() - t0


def test_an_mpi_job_that_never_starts_is_an_error_not_a_hang(tmp_path, monkeypatch):
    # mpirun up, its ranks stuck before MPI_Init returns: no "ready" ever (CI once waited 300 s here)
    found = _fake_mpirun(tmp_path, "print('starting', flush=True); time.sleep(600)")
    text, took = _launch(tmp_path, found, monkeypatch)
    assert "did not start within 2s" in text and "starting" in text, text
    assert took < 30


def test_an_mpirun_that_outlives_its_last_step_is_an_error_not_a_hang(tmp_path, monkeypatch):
    # Open MPI measured its one step and said so, then mpirun never exits: the launcher ends it
    ready = json.dumps({"event": "ready", "world_size": 2, "library": "Open MPI v4.1.4", "python": sys.executable})
    rank = {"times": [1e-5], "wrong": 0, "cpu": 1e-5, "vcsw": 0, "ivcsw": 0}
    result = json.dumps({"event": "result", "op": "all_reduce", "size": 4, "nbytes": 4, "count": 1,
                         "ranks": [rank, rank]})
    found = _fake_mpirun(tmp_path, f"print({mpi.EVENT_PREFIX!r} + {ready!r}, flush=True)\n"
                                   f"sys.stdin.readline()\nprint({mpi.EVENT_PREFIX!r} + {result!r}, flush=True)\n"
                                   "time.sleep(600)")
    text, took = _launch(tmp_path, found, monkeypatch, timeout=30.0, backends=["mpi"])
    assert "mpirun did not exit within 0.5s of its last step" in text, text
    assert took < 30


def test_a_gated_rank_whose_store_went_away_fails_instead_of_waiting_forever():
    # CI waited 300 s: rank 0 (the TCP store's host) had said go and left, rank 1 had not read the turn
    # yet and took the lost connection for its wait's timeout, again and again
    import datetime
    import gc

    import torch.distributed as dist

    from linkescape.bench.runner import Rank, Watchdog
    from linkescape.bench.spec import BenchSpec

    host = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", host.port, 2, False, timeout=datetime.timedelta(seconds=10))
    spec = BenchSpec(ops=["all_reduce"], sizes=[4], world_size=2, backends=["mpi"], iters=1, warmup=0, timeout=10.0)
    rank = Rank(spec, 1, client, lambda ev: None, Watchdog(60.0, lambda ev: None, 1, watch_parent=False))
    del host
    gc.collect()
    t0 = time.monotonic()
    with pytest.raises(BenchError, match="the store is gone while waiting for the turn of step 0"):
        rank.gate(0)
    assert time.monotonic() - t0 < 10


def test_rank_0_leaves_only_after_every_rank_said_it_is_done():
    import datetime
    import threading

    import torch.distributed as dist

    from linkescape.bench.runner import Rank, Watchdog
    from linkescape.bench.spec import BenchSpec

    host = dist.TCPStore("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=20), wait_for_workers=False)
    spec = BenchSpec(ops=["all_reduce"], sizes=[4], world_size=3, backends=["mpi"], iters=1, warmup=0, timeout=20.0)

    def rank(r):
        store = host if r == 0 else dist.TCPStore("127.0.0.1", host.port, 3, False,
                                                  timeout=datetime.timedelta(seconds=20))
        return Rank(spec, r, store, lambda ev: None, Watchdog(60.0, lambda ev: None, r, watch_parent=False))

    ranks = [rank(r) for r in range(3)]
    zero = threading.Thread(target=ranks[0].finish, daemon=True)
    zero.start()
    ranks[2].finish()
    zero.join(0.5)
    assert zero.is_alive()  # rank 1 has not said it is done
    ranks[1].finish()
    zero.join(10)
    assert not zero.is_alive()


def test_an_mpi4py_for_another_mpi_is_named(tmp_path, monkeypatch):
    # an MPICH-built mpi4py under Open MPI's mpirun: each rank is a world of one
    ready = json.dumps({"event": "ready", "world_size": 1, "library": "MPICH Version: 4.1", "python": "/x/python"})
    found = _fake_mpirun(tmp_path, f"print({mpi.EVENT_PREFIX!r} + {ready!r}, flush=True); time.sleep(600)")
    text, took = _launch(tmp_path, found, monkeypatch, timeout=30.0)
    assert "its ranks see a world of 1, not 2" in text and "/x/python" in text and "MPICH" in text, text
    assert took < 30


def test_the_probe_wants_open_mpis_mpi4py(tmp_path):
    # a Python whose mpi4py is not Open MPI's is not one the bench runs its ranks with
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    os.chmod(fake, 0o755)
    assert not mpi._imports(str(fake))
    assert "Open MPI" in mpi.PROBE and "initialize = False" in mpi.PROBE
    if not isinstance(FOUND, str):
        assert mpi._imports(FOUND["python"])


def test_without_mpirun_the_cli_says_how_to_get_it(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(mpi.MpiUnavailable, match="make mpi"):
        mpi.find(path=str(empty))
    assert issubclass(mpi.MpiUnavailable, BenchError)
    result, records = run_bench(["all_reduce", "--sizes", "4", "--backend", "linkescape,mpi"], tmp_path,
                                env={"PATH": str(empty)})
    assert result.exit_code == 1 and not records
    out = result.output.strip().splitlines()
    assert len(out) == 1, result.output  # one line, no traceback
    assert out[0].startswith("Error: backend mpi needs Open MPI's mpirun") and "make mpi" in out[0], out[0]
    assert "apt-get install openmpi-bin" in out[0] and "linkescape[mpi]" in out[0]


def test_without_mpi4py_the_error_names_it(tmp_path, monkeypatch):
    if importlib.util.find_spec("mpi4py") is not None:
        pytest.skip("this Python has mpi4py: the case of a Python without it cannot be made here")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpirun").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(fake / "mpirun", 0o755)
    monkeypatch.setattr(mpi, "SYSTEM_PYTHON", str(tmp_path / "no-python"))
    mpi._python_for_mpi.cache_clear()
    try:
        with pytest.raises(mpi.MpiUnavailable, match=r"mpi4py .*make mpi"):
            mpi.find(path=str(fake))
    finally:
        mpi._python_for_mpi.cache_clear()


@pytest.mark.parametrize("args, text", [
    (["--dtype", "float16"], "backend mpi: dtype float16"),
    (["--op", "avg"], "backend mpi: reduction avg"),
    (["--launcher", "env"], "backend mpi runs its ranks with mpirun"),
])
def test_what_mpi_cannot_do_is_a_usage_error(args, text):
    if isinstance(FOUND, str) and "--launcher" not in args:
        pytest.skip(f"no Open MPI here ({FOUND})")
    result = CliRunner().invoke(bench, ["all_reduce", "--sizes", "4", "--backend", "mpi", *args])
    assert result.exit_code == 2 and text in result.output, result.output


def test_the_mpirun_command_runs_tcp_only_on_loopback():
    found = {"mpirun": "/usr/bin/mpirun", "python": "/usr/bin/python3"}
    cmd = mpi.command(found, 4, "{}")
    assert cmd[:4] == ["/usr/bin/mpirun", "-n", "4", "--oversubscribe"]
    assert cmd[-4:] == ["/usr/bin/python3", mpi.RANK_SCRIPT, "--spec", "{}"] and os.path.exists(mpi.RANK_SCRIPT)
    env = mpi.env({"PATH": "/bin", "OMPI_MCA_btl_tcp_if_include": "eth9"})
    assert env["OMPI_MCA_pml"] == "ob1" and env["OMPI_MCA_btl"] == "tcp,self"
    assert env["OMPI_MCA_btl_tcp_if_include"] == "eth9"  # the user's choice stays


def test_medians_of_three_backends_keep_isolated_runs_apart():
    from linkescape.bench.report import format_medians, median_table

    def rec(backend, t, isolated, cpu):
        return {"op": "all_reduce", "backend": backend, "world_size": 4, "type": "float32", "size": 4,
                "time_us": t, "busbw_factor": 1.5, "busbw": 4 / t / 1e3 * 1.5, "wrong": 0, "isolated": isolated,
                "cpu_us": cpu, "vcsw": 2.0,
                "ivcsw": 0.5}
    runs = [[rec("linkescape", le, iso, 100.0 + i), rec("gloo", gl, iso, 200.0), rec("mpi", mp, iso, 50.0)]
            for i, (le, gl, mp) in enumerate([(100, 200, 10), (300, 200, 20), (150, 100, 30)])
            for iso in (False, True)]
    rows = median_table(runs)
    assert [r["isolated"] for r in rows] == [False, True]  # one row each, not mixed
    row = rows[0]
    assert row["linkescape"]["time_us"] == 150 and row["mpi"]["time_us"] == 20
    assert row["time_ratio"] == 1.5  # linkescape/gloo per run: 0.5, 1.5, 1.5
    assert row["time_ratio_mpi"] == 10.0  # linkescape/mpi per run: 10, 15, 5
    assert row["linkescape"]["cpu_us"] == 101.0 and row["gloo"]["vcsw"] == 2.0
    text = format_medians(rows, markdown=True, usage=True)
    head = text.splitlines()[0]
    assert "time ratio /mpi" in head and "mpi CPU (us/call/rank)" in head and "| timing |" in head
    assert "| all_reduce | 4 | 4 B | isolated | 150.0 |" in text
