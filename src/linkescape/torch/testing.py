"""Helpers to run multi-process torch.distributed jobs on loopback (tests,
examples): every rank is a process of its own with the environment that
``torchrun`` would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), forked from a launcher that imported torch once, or a fresh
``python`` each (``start="spawn"``), or a real ``torchrun``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence


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
    """A port that was free a moment ago. Another socket on the host may be
    given it before it is used (a listener that binds port 0, a connect):
    for a port a job will listen on, ``reserved_port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A TCP port that the kernel gives no other socket while the block runs,
    yet that a listener with SO_REUSEADDR (a TCPStore, Python's
    ``socketserver``, ours) can still bind: it is held by a bound socket with
    SO_REUSEADDR that never listens. A bind to port 0 and a connect's local
    port never take a port that has a bound socket; two sockets that both
    set SO_REUSEADDR share a port while neither listens. ``free_port``'s
    port, instead, was taken between its release and the job's listen when
    tests ran in parallel (EADDRINUSE at a rank 0's TCPStore)."""
    holder = _port_holder()
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


def _port_holder() -> socket.socket:
    """The socket that holds a ``reserved_port`` (its port: ``getsockname()[1]``)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
    except BaseException:
        holder.close()
        raise
    return holder


def _base_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    if extra:
        env.update(extra)
    return env


def _communicate(p: subprocess.Popen, timeout: float):
    """(stdout, stderr, timed out): the process's output; at the timeout its
    session (it and every process it started) is killed first."""
    try:
        so, se = p.communicate(timeout=timeout)
        return so, se, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()
        so, se = p.communicate()
        return so, se, True


def _collect(procs: Sequence[subprocess.Popen], timeout: float) -> List[RankResult]:
    deadline = time.monotonic() + timeout
    out: List[RankResult] = []
    for rank, p in enumerate(procs):
        so, se, timed_out = _communicate(p, max(0.1, deadline - time.monotonic()))
        out.append(RankResult(rank, p.returncode, so, se, timed_out))
    return out


def launch(argv: Sequence[str], nprocs: int, *, env: Optional[Dict[str, str]] = None, timeout: float = 60.0,
           per_rank_env: Optional[Dict[int, Dict[str, str]]] = None, cwd: Optional[str] = None,
           start: str = "fork") -> List[RankResult]:
    """Run ``python argv...`` as ``nprocs`` ranks of one job; wait for all.

    ``start="fork"``: one launcher process imports torch.distributed (with
    the job's environment) and forks the ranks, each then running ``argv``
    as ``__main__`` with its own RANK/LOCAL_RANK (and ``per_rank_env``),
    stdout and stderr, and leaving as an interpreter does (atexit, threads).
    Each rank is still a process of its own; it only does not import torch
    again (1.8 CPU-seconds a rank). ``"spawn"``: a fresh ``python`` per rank,
    for what depends on the interpreter's start (import-time settings)."""
    with reserved_port() as port:  # held until every rank has exited
        return _launch(argv, nprocs, port, env=env, timeout=timeout, per_rank_env=per_rank_env, cwd=cwd,
                       start=start)


def _launch(argv: Sequence[str], nprocs: int, port: int, *, env: Optional[Dict[str, str]], timeout: float,
            per_rank_env: Optional[Dict[int, Dict[str, str]]], cwd: Optional[str], start: str) -> List[RankResult]:
    job = {"WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    ranks = []
    for rank in range(nprocs):
        e = {"RANK": str(rank), "LOCAL_RANK": str(rank)}
        if per_rank_env and rank in per_rank_env:
            e.update(per_rank_env[rank])
        ranks.append(e)
    if start == "spawn":
        procs = [subprocess.Popen([sys.executable, *argv], env={**_base_env(env), **job, **e}, cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
                 for e in ranks]
        return _collect(procs, timeout)
    if start != "fork":
        raise ValueError(f"start must be 'fork' or 'spawn', not {start!r}")
    return _launch_forked(list(argv), ranks, {**_base_env(env), **job}, cwd, timeout)


def _launch_forked(argv: List[str], ranks: List[Dict[str, str]], env: Dict[str, str], cwd: Optional[str],
                   timeout: float) -> List[RankResult]:
    import json
    import threading

    pipes = [(os.pipe(), os.pipe()) for _ in ranks]
    spec = {"argv": argv,
            "ranks": [{"env": e, "out": o[1], "err": er[1]} for e, (o, er) in zip(ranks, pipes)]}
    keep = [fd for (o, er) in pipes for fd in (o[1], er[1])]
    try:
        launcher = subprocess.Popen([sys.executable, "-c", "from linkescape.torch.testing import _fork_main; "
                                     "_fork_main()", json.dumps(spec)], env=env, cwd=cwd, pass_fds=keep,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
    finally:
        for fd in keep:
            os.close(fd)
    texts: Dict[int, List[bytes]] = {}

    def drain(fd: int) -> None:
        chunks = texts.setdefault(fd, [])
        with os.fdopen(fd, "rb") as f:
            while True:
                b = f.read1(65536)
                if not b:
                    return
                chunks.append(b)
    readers = [threading.Thread(target=drain, args=(fd,), daemon=True)
               for (o, er) in pipes for fd in (o[0], er[0])]
    for t in readers:
        t.start()
    so, se, timed_out = _communicate(launcher, timeout)  # (the ranks are in the launcher's session)
    for t in readers:
        t.join(timeout=10)
    codes: Dict[int, int] = {}
    for line in so.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            codes[rec["rank"]] = rec["code"]
    out = []
    for rank, (o, er) in enumerate(pipes):
        text = b"".join(texts.get(o[0], [])).decode(errors="replace")
        err = b"".join(texts.get(er[0], [])).decode(errors="replace")
        if rank not in codes and not timed_out:
            err += f"\n--- launcher (exit {launcher.returncode}):\n{se[-4000:]}"
        out.append(RankResult(rank, codes.get(rank), text, err, timed_out and rank not in codes))
    return out


def _fork_main() -> None:
    """The launcher of ``launch(start="fork")`` (argv[1]: its JSON spec)."""
    import json
    import runpy

    spec = json.loads(sys.argv[1])
    import torch.distributed  # noqa: F401 - once, before the ranks are forked

    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for rank, r in enumerate(spec["ranks"]):
        pid = os.fork()
        if pid == 0:  # the rank: its environment and output, then the script as __main__
            os.environ.update(r["env"])
            if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
                sys.modules["numpy"].random.seed()
            os.dup2(r["out"], 1)
            os.dup2(r["err"], 2)
            for other in spec["ranks"]:
                os.close(other["out"])
                os.close(other["err"])
            argv = spec["argv"]
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                code = compile(argv[1], "<string>", "exec")
                exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            sys.exit(0)  # (an exception or SystemExit leaves as the interpreter would)
        children[pid] = rank
    for r in spec["ranks"]:
        os.close(r["out"])
        os.close(r["err"])
    while children:
        pid, status = os.wait()
        rank = children.pop(pid, None)
        if rank is not None:
            print(json.dumps({"rank": rank, "code": os.waitstatus_to_exitcode(status)}), flush=True)


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
    import weakref

    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    holder = _port_holder()  # (reserved_port's) held as long as the Popen lives: torchrun's agent listens on it
    cmd += [f"--nproc-per-node={nprocs}", "--master-addr=127.0.0.1", f"--master-port={holder.getsockname()[1]}",
            *launcher_args, *script_argv]
    try:
        p = subprocess.Popen(cmd, env=_base_env(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    except BaseException:
        holder.close()
        raise
    weakref.finalize(p, holder.close)
    return p


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


__all__ = ["launch", "launch_ok", "torchrun", "torchrun_popen", "failures", "free_port", "reserved_port", "RankResult", "BAD_EXIT_MARKERS"]
