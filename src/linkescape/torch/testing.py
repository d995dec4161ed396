"""Helpers to run multi-process torch.distributed jobs on loopback (tests,
examples): every rank is a fresh ``python`` process with the environment that
``torchrun`` would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), or a real ``torchrun``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool = False

    def describe(self) -> str:
        return (f"--- rank {self.rank}: returncode={self.returncode} timed_out={self.timed_out}\n"
                f"--- stdout:\n{self.stdout[-4000:]}\n--- stderr:\n{self.stderr[-6000:]}")


#: stderr text that means the process did not exit cleanly
BAD_EXIT_MARKERS = ("terminate called", "Aborted", "core dumped", "Fatal Python error", "Segmentation fault",
                    "abort()", "libc++abi")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    if extra:
        env.update(extra)
    return env


def _collect(procs: Sequence[subprocess.Popen], timeout: float) -> List[RankResult]:
    deadline = time.monotonic() + timeout
    out: List[RankResult] = []
    for rank, p in enumerate(procs):
        left = max(0.1, deadline - time.monotonic())
        timed_out = False
        try:
            so, se = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            so, se = p.communicate()
        out.append(RankResult(rank, p.returncode, so, se, timed_out))
    return out


def launch(argv: Sequence[str], nprocs: int, *, env: Optional[Dict[str, str]] = None, timeout: float = 60.0,
           per_rank_env: Optional[Dict[int, Dict[str, str]]] = None, cwd: Optional[str] = None
           ) -> List[RankResult]:
    """Run ``python argv...`` as ``nprocs`` ranks of one job; wait for all."""
    port = free_port()
    procs = []
    for rank in range(nprocs):
        e = _base_env(env)
        e.update({"RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
                  "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        if per_rank_env and rank in per_rank_env:
            e.update(per_rank_env[rank])
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    return _collect(procs, timeout)


def torchrun(script_argv: Sequence[str], nprocs: int, *, env: Optional[Dict[str, str]] = None,
             timeout: float = 60.0, cwd: Optional[str] = None, launcher_args: Sequence[str] = ()) -> RankResult:
    """Run a script under the real ``torchrun`` (one result for the launcher);
    ``launcher_args`` go to torchrun itself (``--max-restarts=1``)."""
    return _collect([torchrun_popen(script_argv, nprocs, env=env, cwd=cwd, launcher_args=launcher_args)],
                    timeout)[0]


def torchrun_popen(script_argv: Sequence[str], nprocs: int, *, env: Optional[Dict[str, str]] = None,
                   cwd: Optional[str] = None, launcher_args: Sequence[str] = ()) -> subprocess.Popen:
    """``torchrun`` started (its output in pipes, in a session of its own), for a caller that reads
    its output as it comes."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    cmd += [f"--nproc-per-node={nprocs}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
            *launcher_args, *script_argv]
    return subprocess.Popen(cmd, env=_base_env(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def failures(results: Sequence[RankResult], expect_rc: Optional[Dict[int, int]] = None) -> str:
    """Text describing every rank that did not exit as expected (0 by
    default) or printed an abnormal-exit marker; empty when all is well."""
    bad = []
    for r in results:
        want = (expect_rc or {}).get(r.rank, 0)
        marker = next((m for m in BAD_EXIT_MARKERS if m in r.stderr), None)
        if r.timed_out or r.returncode != want or (marker and want == 0):
            bad.append(r.describe())
    return "\n".join(bad)


def launch_ok(argv: Sequence[str], nprocs: int, *, ok: str = "ok", **kwargs) -> List[RankResult]:
    """``launch``, then assert that every rank exited cleanly and printed
    ``rank R: <ok>`` (the convention of the test scripts)."""
    res = launch(argv, nprocs, **kwargs)
    bad = failures(res)
    assert not bad, bad
    for r in res:
        assert f"rank {r.rank}: {ok}" in r.stdout, r.describe()
    return res


__all__ = ["launch", "launch_ok", "torchrun", "torchrun_popen", "failures", "free_port", "RankResult", "BAD_EXIT_MARKERS"]
