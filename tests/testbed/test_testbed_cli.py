"""The ``testbed`` and ``fault`` click commands, end to end on real namespaces."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from linkescape.testbed.cli import fault, testbed as tb_cli
from linkescape.testbed.netns import Testbed, find_leftovers, state_path, unique_name
from linkescape.testbed.probe import tcp_check
from linkescape.testbed.pytest_fixtures import require_nft, require_testbed, testbed as tb2, testbed_factory  # noqa: F401


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_commands_need_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    runner = CliRunner()
    for group, args in ((tb_cli, ["up", "--name", "nr"]), (tb_cli, ["down", "--name", "nr"]),
                        (fault, ["cut", "--host", "0", "--rail", "0", "--name", "nr"])):
        res = runner.invoke(group, args)
        assert res.exit_code == 1, res.output
        assert "needs root" in res.output


@pytest.mark.testbed
def test_up_status_fault_down_via_cli():
    require_testbed()
    name = unique_name()
    runner = CliRunner()
    try:
        res = runner.invoke(tb_cli, ["up", "--hosts", "2", "--rails", "2", "--rate", "1gbit", "--name", name])
        assert res.exit_code == 0, res.output
        assert f"{name}-h1" in res.output and "198.18.1.2" in res.output
        tb = Testbed.attach(name)
        assert tb.rate == "1gbit"

        res = runner.invoke(fault, ["cut", "--host", "0", "--rail", "1", "--name", name])
        assert res.exit_code == 0, res.output
        (ev,) = _json_lines(res.output)
        assert ev["fault"] == "cut" and ev["host"] == 0 and ev["rail"] == 1 and isinstance(ev["ts"], float)
        assert not tb.link_state(0, 1).carrier

        res = runner.invoke(tb_cli, ["status", "--json", "--name", name])
        st = json.loads(res.output)
        nic = st["host_status"][0]["nics"][1]
        assert nic["nic"] == "r1" and nic["cut"] and not nic["carrier"]
        res = runner.invoke(tb_cli, ["status", "--name", name])
        assert "no-carrier CUT" in res.output

        res = runner.invoke(fault, ["restore", "--host", "0", "--rail", "r1", "--name", name])
        assert res.exit_code == 0 and _json_lines(res.output)[0]["fault"] == "restore"
        assert tb.link_state(0, 1).usable

        res = runner.invoke(fault, ["flap", "--host", "1", "--rail", "mgmt", "--period", "0.2", "--count", "2",
                                    "--name", name])
        assert res.exit_code == 0, res.output
        assert [e["state"] for e in _json_lines(res.output)] == ["down", "up", "down", "up"]

        res = runner.invoke(fault, ["cut", "--host", "5", "--rail", "0", "--name", name])
        assert res.exit_code == 1 and "host 5" in res.output

        os.unlink(state_path(name))  # down must not need the state file
    finally:
        res = runner.invoke(tb_cli, ["down", "--name", name])
    assert res.exit_code == 0, res.output
    assert find_leftovers(name) == {}
    res = runner.invoke(tb_cli, ["down", "--name", name])
    assert res.exit_code == 0 and "nothing to remove" in res.output


@pytest.mark.testbed
def test_run_passes_exit_code_through(tb2):
    cmd = [sys.executable, "-m", "linkescape.testbed.cli", "testbed", "run", "--host", "1", "--name", tb2.name,
           "--", "sh", "-c", "ip -4 -br addr show r0; exit 7"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 7, proc.stderr
    assert "198.18.0.2/24" in proc.stdout


@pytest.mark.testbed
def test_blackhole_via_cli(tb2):
    require_nft()
    runner = CliRunner()
    res = runner.invoke(fault, ["blackhole", "--host", "0", "--rail", "0", "--name", tb2.name])
    assert res.exit_code == 0, res.output
    assert _json_lines(res.output)[0]["fault"] == "blackhole"
    assert tb2.link_state(0, 0).blackholed and not tcp_check(tb2, 1, 0, 0, timeout=0.8)
    runner.invoke(fault, ["restore", "--host", "0", "--rail", "0", "--name", tb2.name])
    assert tcp_check(tb2, 1, 0, 0)


_ENV_SCRIPT = textwrap.dedent("""
    import os, sys
    keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "LINKESCAPE_RAILS", "LINKESCAPE_TESTBED_HOST"]
    line = "ENV " + " ".join(f"{k}={os.environ.get(k)}" for k in keys) + " ARGS=" + ",".join(sys.argv[1:])
    os.write(1, (line + "\\n").encode())  # one write: two local ranks share the host's pipe
""")


@pytest.mark.testbed
def test_launch_runs_one_torchrun_per_host(testbed_factory, tmp_path, monkeypatch):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    # Keep torch from auto-loading device backends (linkescape's own among
    # them): this test is about the launcher, not the backend.
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    tb = testbed_factory(2, 3)
    script = tmp_path / "env.py"
    script.write_text(_ENV_SCRIPT)
    runner = CliRunner()
    res = runner.invoke(tb_cli, ["launch", "--name", tb.name, "--nproc-per-node", "2", "--master-port", "29517",
                                  "--timeout", "60", "--", str(script), "--flag", "x"])
    assert res.exit_code == 0, res.output
    lines = sorted(l for l in res.output.splitlines() if "ENV " in l)
    assert len(lines) == 4, res.output
    for rank in range(4):
        host = rank // 2
        assert any(l.startswith(f"[h{host}] ENV RANK={rank} WORLD_SIZE=4 MASTER_ADDR=198.19.0.1 "
                                f"LINKESCAPE_RAILS=r0,r1,r2 LINKESCAPE_TESTBED_HOST={host} ARGS=--flag,x")
                   for l in lines), (rank, lines)



_FAKE_TORCHRUN = textwrap.dedent("""
    # Stands in for torchrun: node 1 fails at once, node 0 hangs as if waiting for it.
    import os, sys, time
    rank = int(sys.argv[sys.argv.index("--node-rank") + 1])
    print("node", rank, "mgmt", sys.argv[sys.argv.index("--master-addr") + 1], os.environ["LINKESCAPE_RAILS"])
    sys.exit(3) if rank == 1 else time.sleep(60)
""")


@pytest.mark.testbed
def test_launch_stops_the_others_when_one_host_fails(tb2, tmp_path):
    from linkescape.testbed.launch import launch

    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(_FAKE_TORCHRUN)
    out = tmp_path / "out.txt"
    t0 = time.monotonic()
    with open(out, "w") as f:
        rc = launch(tb2, ["job.py"], torchrun=[sys.executable, str(fake)], grace=0.5, stdout=f)
    assert rc == 3  # the failing host's status, not the SIGTERM of the one we stopped
    assert time.monotonic() - t0 < 10
    text = out.read_text()
    assert "[h0] node 0 mgmt 198.19.0.1 r0,r1" in text and "[h1] node 1" in text
    assert launch(tb2, ["job.py"], torchrun=[sys.executable, str(fake)], timeout=0.5, stdout=open(os.devnull, "w")) == 124


@pytest.mark.testbed
def test_flap_in_background_ends_up_on_sigterm(tb2):
    """Benchmarks run `fault flap` as a background process and stop it with SIGTERM."""
    cmd = [sys.executable, "-m", "linkescape.testbed.cli", "fault", "flap", "--host", "0", "--rail", "1",
           "--period", "20", "--name", tb2.name]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    first = json.loads(proc.stdout.readline())
    assert first["state"] == "down" and not tb2.link_state(0, 1).carrier
    proc.terminate()
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert [e["state"] for e in _json_lines(rest)] == ["up"]
    assert tb2.link_state(0, 1).usable
