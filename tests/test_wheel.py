"""The package installs (issue 19): the wheel, built from this tree, installed into a fresh virtual
environment (not editable, base install only), runs a 2-process torchrun job on
``init_process_group("linkescape")`` without ``import linkescape`` (the backend comes through the
``torch.backends`` entry point), and the ``linkescape`` command works and names the extra a part needs.

torch is the one tested version, ``torch==2.13.0`` (its CPU build: pip's find-links or cache); pip's
cache is reused and nothing is byte-compiled but what the job imports, so the run costs the venv, the
installs and the job. The wheel is built with the setuptools of the running environment when it is
recent enough (offline), else in pip's isolated build environment.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # what CI tests (Makefile); an unpinned torch would pull a multi-GB CUDA build

JOB = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("linkescape")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.arange(8, dtype=torch.float32) + 100 * rank
    dist.all_reduce(t)
    want = sum(torch.arange(8, dtype=torch.float32) + 100 * r for r in range(world))
    assert torch.equal(t, want), (t, want)
    mod = sys.modules.get("linkescape")
    assert mod is not None, "the backend was not loaded through the torch.backends entry point"
    print(f"rank {rank}: all_reduce ok, backend {dist.get_backend()}, from {os.path.dirname(mod.__file__)}",
          flush=True)
    dist.destroy_process_group()
""")


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _offline_build() -> list:
    """``--no-build-isolation`` when this environment's setuptools can build the package (nothing to download)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if major >= 77 else []  # pyproject.toml: setuptools>=77


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LINKESCAPE_", "TORCH_")) and k != "PYTEST_CURRENT_TEST"}
    env.update(extra)
    return env


def test_the_wheel_installs_and_runs_a_torchrun_job(tmp_path):
    # the tree as it is (committed or not), without what an editable install or a build left in it
    src = tmp_path / "src"
    for half in ("src", "tools"):  # the library and its tools: one package, both in the wheel (setup.py)
        shutil.copytree(ROOT / half, src / half, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_offline_build(), "-q", "-w", str(dist), str(src)])
    wheels = list(dist.glob("linkescape-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py, bindir = venv / "bin" / "python", venv / "bin"
    env = _clean_env(PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    # --no-compile: pip would byte-compile all of torch (18 of the 26 CPU-seconds of this install); the
    # first import below compiles only what a job imports, once, for the three processes of the job
    _run([str(py), "-m", "pip", "install", "-q", "--no-compile", TORCH, str(wheels[0])], env=env)

    # installed, not editable: the package lives in the new environment's site-packages
    where = _run([str(py), "-c", "import linkescape, os, torch.distributed; "
                  "print(os.path.dirname(linkescape.__file__))"], env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where

    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = _run([str(bindir / "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(script)],
               env={**env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path, timeout=240)
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce ok, backend linkescape, from {where}" in job.stdout, job.stdout

    # the tools came with the library, in the same folder (not a source checkout's second half)
    tools = _run([str(py), "-c", "import linkescape, linkescape.bench.report as r, os; "
                  "print(linkescape.__path__, os.path.dirname(os.path.dirname(r.__file__)))"],
                 env=env, cwd=tmp_path).stdout.strip()
    assert tools == f"[{where!r}] {where}", tools
    # the command runs on the base install; a part whose extra is missing says which one
    _run([str(bindir / "linkescape"), "--help"], env=env, cwd=tmp_path)
    demo = subprocess.run([str(bindir / "linkescape"), "demo", "--out", str(tmp_path / "demo")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert demo.returncode != 0 and "pip install 'linkescape[demo]'" in demo.stderr, demo.stderr[-2000:]
    assert not (tmp_path / "demo" / "faulty").exists()  # it failed before it started anything
