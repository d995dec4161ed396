"""Run a torchrun job across the hosts of a testbed.

One ``torchrun`` per host, each started inside its namespace with
``ip netns exec``; rendezvous (torchrun's static c10d store on host 0) goes
over the management network, as on a cluster's front-end network, while the
job's own traffic uses the rails named in ``LINKESCAPE_RAILS``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Set

from .netns import TestbedError

if TYPE_CHECKING:  # pragma: no cover
    from .netns import Testbed

DEFAULT_MASTER_PORT = 29500


def default_torchrun() -> List[str]:
    """``torchrun`` next to this interpreter (a venv), else ``python -m torch.distributed.run``."""
    path = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_argv(tb: "Testbed", host: int, script: Sequence[str], *, nnodes: int, nproc_per_node: int = 1,
                  master_port: int = DEFAULT_MASTER_PORT, torchrun: Optional[Sequence[str]] = None) -> List[str]:
    """The command line for host ``host`` (without the ``ip netns exec`` prefix)."""
    return [*(torchrun or default_torchrun()),
            "--nnodes", str(nnodes), "--node-rank", str(host), "--nproc-per-node", str(nproc_per_node),
            "--master-addr", tb.mgmt_addr(0), "--master-port", str(master_port), *script]


def job_env(tb: "Testbed", host: int, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Environment of host ``host``'s torchrun: the caller's plus the testbed's."""
    env = dict(os.environ)
    env.update(extra or {})
    env["LINKESCAPE_RAILS"] = ",".join(tb.rail_nics)
    env["LINKESCAPE_TESTBED"] = tb.name
    env["LINKESCAPE_TESTBED_HOST"] = str(host)
    # gloo would otherwise resolve the (shared) hostname to an address that is
    # not inside the testbed; keep its sockets on the front-end network.
    env.setdefault("GLOO_SOCKET_IFNAME", "mgmt")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def exit_status(rc: int) -> int:
    """Shell-style exit status: a death by signal N becomes 128 + N."""
    return 128 - rc if rc < 0 else rc


def _pump(src: IO[bytes], prefix: bytes, dst: IO, lock: threading.Lock) -> None:
    out = getattr(dst, "buffer", None)
    for line in iter(src.readline, b""):
        with lock:
            if out is not None:
                out.write(prefix + line)
                out.flush()
            else:  # a text-only stream (e.g. under test runners)
                dst.write((prefix + line).decode(errors="replace"))
                dst.flush()
    src.close()


def launch(tb: "Testbed", script: Sequence[str], *, hosts: Optional[int] = None, nproc_per_node: int = 1,
           master_port: int = DEFAULT_MASTER_PORT, torchrun: Optional[Sequence[str]] = None,
           env: Optional[Mapping[str, str]] = None, prefix_output: bool = True, timeout: Optional[float] = None,
           grace: float = 30.0, stdout: Optional[IO] = None) -> int:
    """Run ``script`` (a path and its arguments) with torchrun on hosts 0..hosts-1.

    Waits for every host and returns the worst exit status (0 when all
    succeed). Once a host fails, the others get ``grace`` seconds before they
    are terminated, since their workers would otherwise wait for the dead
    peer until some collective times out. ``timeout`` bounds the whole job
    (status 124, as timeout(1)). With ``prefix_output`` every output line is
    tagged ``[hI]``.
    """
    if not script:
        raise TestbedError("launch needs a script to run")
    n = tb.hosts if hosts is None else hosts
    if not 1 <= n <= tb.hosts:
        raise TestbedError(f"--hosts {n}: testbed {tb.name!r} has {tb.hosts} hosts")
    stdout = stdout or sys.stdout
    lock = threading.Lock()
    procs: List[subprocess.Popen] = []
    pumps: List[threading.Thread] = []
    try:
        for i in range(n):
            argv = tb.cmd(i, torchrun_argv(tb, i, script, nnodes=n, nproc_per_node=nproc_per_node,
                                           master_port=master_port, torchrun=torchrun))
            pipe = subprocess.PIPE if prefix_output else None
            # Own session per host: terminating a host reaches torchrun's workers too.
            p = subprocess.Popen(argv, env=job_env(tb, i, env), stdout=pipe,
                                 stderr=subprocess.STDOUT if prefix_output else None, start_new_session=True)
            procs.append(p)
            if prefix_output:
                t = threading.Thread(target=_pump, args=(p.stdout, f"[h{i}] ".encode(), stdout, lock), daemon=True)
                t.start()
                pumps.append(t)
        deadline = None if timeout is None else time.monotonic() + timeout
        kill_at: Optional[float] = None
        timed_out = False
        killed: Set[int] = set()  # hosts still running when we terminated the job
        while True:
            states = [p.poll() for p in procs]  # poll every host, no short-circuit
            if None not in states:
                break
            now = time.monotonic()
            if kill_at is None and any(rc not in (None, 0) for rc in states):
                kill_at = now + grace
            expired = deadline is not None and now >= deadline
            if not killed and (expired or (kill_at is not None and now >= kill_at)):
                timed_out = expired
                killed = {i for i, rc in enumerate(states) if rc is None}
                _terminate(procs)
            time.sleep(0.05)
        for t in pumps:
            t.join(5)
        if timed_out:
            return 124
        # Hosts we terminated after another failed are victims: report the failure itself.
        own = [i for i in range(len(procs)) if i not in killed] or list(range(len(procs)))
        return max(exit_status(procs[i].returncode) for i in own)
    finally:
        _terminate(procs)


def _terminate(procs: Sequence[subprocess.Popen], wait: float = 5.0) -> None:
    alive = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait
        while alive and time.monotonic() < end:
            time.sleep(0.05)
            alive = [p for p in alive if p.poll() is None]
        if not alive:
            return


__all__ = ["launch", "torchrun_argv", "job_env", "default_torchrun", "DEFAULT_MASTER_PORT"]
