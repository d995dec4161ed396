"""The rank processes of one job, in testbed hosts or on this machine, and what they say.

:class:`RankJob` is the one way this project starts ranks: the fault tests'
workload (:class:`Job`), the failover benchmark, the chaos soak and the demo
(torchrun per host, or local ranks with torchrun's environment) all use it.
It

* starts one process per rank: inside testbed host ``hosts[rank]``
  (``ip netns exec``) when given a testbed, else on this machine; optionally
  each in its own session, so that stopping it reaches its children (torchrun's
  workers);
* follows what the ranks say: stdout JSON lines land in :attr:`RankJob.records`
  (and :meth:`RankJob.wait_for` / :meth:`RankJob.wait` block on them), or all
  output goes to one log file, each line tagged ``[hI]``; stderr is kept in
  memory or in ``stderr-R.txt`` files; each rank's event trail
  (``LINKESCAPE_EVENTS``) is tailed incrementally (:meth:`RankJob.events`);
* ends them: :meth:`RankJob.finish` touches the stop file the ranks poll and
  waits for their ``exit`` records; a rank still running then is *hung*: its
  Python stacks are asked for (SIGUSR1, which the workers hand to faulthandler)
  before it is killed. :meth:`RankJob.wait_exit` is the torchrun-style end
  (worst exit status; once one rank failed the others get a grace period; a
  job over its time limit is stopped with status 124). :meth:`RankJob.close`
  kills whatever is left and removes a temporary directory.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..common.private import open_private, open_private_file, private_dir
from ..common.jsonl import Tail, parse, read as read_jsonl
from .netns import Testbed

#: bytes of a rank's stderr kept in memory (the tail)
STDERR_KEEP = 256 * 1024

OnRecord = Callable[[int, Dict[str, Any]], None]


def exit_status(rc: int) -> int:
    """Shell-style exit status: a death by signal N becomes 128 + N."""
    return 128 - rc if rc < 0 else rc


class RankJob:
    """``commands[rank]`` as one process per rank.

    ``tb``/``hosts``: run rank ``r`` inside testbed host ``hosts[r]`` (default:
    host ``r``); without ``tb`` the ranks run here. ``env`` is added to this
    process's environment for every rank, ``rank_env(rank)`` per rank.
    ``workdir``: the job's directory (stop file, stderr files, stores); None
    makes a temporary one that :meth:`close` removes. ``log``: a path; all
    output of every rank goes there, tagged ``[hI] ``, and nothing is parsed.
    Otherwise stdout is parsed as JSON lines (each record gets ``rank``) and
    ``on_record(rank, record)`` is called for each, from a reader thread.
    ``stderr_files``: stderr goes to ``workdir/stderr-R.txt`` (kept) instead
    of memory. ``events``: the ranks' ``LINKESCAPE_EVENTS`` template
    (``{rank}``), tailed by :meth:`events`. ``session``: each rank in its own
    session (stops reach its children). ``dump_signal``: sent to a hung rank
    before it is killed (None: none).
    """

    def __init__(self, commands: Sequence[Sequence[str]], *, tb: Optional[Testbed] = None,
                 hosts: Optional[Sequence[int]] = None, env: Optional[Mapping[str, str]] = None,
                 rank_env: Optional[Callable[[int], Mapping[str, str]]] = None, workdir: Optional[str] = None,
                 log: Optional[str] = None, on_record: Optional[OnRecord] = None, stderr_files: bool = False,
                 events: Optional[str] = None, session: bool = False,
                 dump_signal: Optional[int] = signal.SIGUSR1) -> None:
        self.tb = tb
        self.world = len(commands)
        self.hosts = list(hosts) if hosts is not None else list(range(self.world))
        if len(self.hosts) != self.world:
            raise ValueError(f"{self.world} commands for {len(self.hosts)} hosts")
        self._own_dir = workdir is None
        # private (0700, ours, not a symlink): root writes fixed names in it,
        # and the stores (the job's secret) live here (issue 48)
        self.dir = private_dir(workdir, prefix="linkescape-job-")
        self.stop_file = os.path.join(self.dir, "stop")
        self.events_tmpl = events
        self.tails = [Tail(events.replace("{rank}", str(r))) for r in range(self.world)] if events else []
        self.on_record = on_record
        self.session = session
        self.dump_signal = dump_signal
        self.stderr_files = stderr_files
        self.records: List[Dict[str, Any]] = []  #: every record of every rank, in arrival order
        self.by_rank: List[List[Dict[str, Any]]] = [[] for _ in range(self.world)]
        self.stderr: List[str] = ["" for _ in range(self.world)]  #: stderr tails (unless stderr_files)
        self.hung: List[bool] = [False] * self.world
        self.lines: "queue.Queue[Dict[str, Any]]" = queue.Queue()  #: records as they come (any rank)
        self.procs: List[subprocess.Popen] = []
        self._cond = threading.Condition()
        self._threads: List[threading.Thread] = []
        self._log: Optional[IO[bytes]] = open_private_file(log, "ab") if log else None
        self._log_lock = threading.Lock()
        try:
            for rank, argv in enumerate(commands):
                self._start(rank, list(argv), env, rank_env)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ starting
    def _start(self, rank: int, argv: List[str], env: Optional[Mapping[str, str]],
               rank_env: Optional[Callable[[int], Mapping[str, str]]]) -> None:
        e = dict(os.environ)
        e.update(env or {})
        if rank_env is not None:
            e.update(rank_env(rank))
        if self._log is not None:
            out, err = subprocess.PIPE, subprocess.STDOUT
        else:
            out = subprocess.PIPE
            err = open_private_file(self.stderr_path(rank), "w") if self.stderr_files else subprocess.PIPE
        cmd = self.tb.cmd(self.hosts[rank], argv) if self.tb is not None else argv
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=e, start_new_session=self.session)
        finally:
            if hasattr(err, "close"):
                err.close()  # the child holds its own copy
        self.procs.append(proc)
        if self._log is not None:
            self._spawn(self._pump_log, rank, proc)
            return
        self._spawn(self._pump, rank, proc)
        if not self.stderr_files:
            self._spawn(self._pump_err, rank, proc)

    def _spawn(self, target, rank: int, proc: subprocess.Popen) -> None:
        th = threading.Thread(target=target, args=(rank, proc), name=f"job-{target.__name__}-{rank}", daemon=True)
        th.start()
        self._threads.append(th)

    def _pump(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            rec = parse(line)
            if rec is None:
                continue
            rec["rank"] = rank
            with self._cond:
                self.records.append(rec)
                self.by_rank[rank].append(rec)
                self._cond.notify_all()
            self.lines.put(rec)
            if self.on_record is not None:
                try:
                    self.on_record(rank, rec)
                except Exception:  # noqa: BLE001 - an observer must not stop the reader
                    pass

    def _pump_err(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            s = self.stderr[rank] + (line.decode(errors="replace") if isinstance(line, bytes) else line)
            self.stderr[rank] = s[-STDERR_KEEP:]

    def _pump_log(self, rank: int, proc: subprocess.Popen) -> None:
        prefix = f"[h{self.hosts[rank]}] ".encode()
        for line in iter(proc.stdout.readline, b""):
            with self._log_lock:
                if self._log is not None:
                    self._log.write(prefix + line)
                    self._log.flush()

    # ------------------------------------------------------------ what the ranks said
    def stderr_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"stderr-{rank}.txt")

    def stderr_tail(self, rank: int, n: int = 4000) -> str:
        if self.stderr_files:
            try:
                with open(self.stderr_path(rank), errors="replace") as fh:
                    return fh.read()[-n:]
            except OSError:
                return ""
        return self.stderr[rank][-n:]

    def records_of(self, rank: int, event: str) -> List[Dict[str, Any]]:
        with self._cond:
            return [r for r in self.by_rank[rank] if r.get("event") == event]

    def exit_record(self, rank: int) -> Optional[Dict[str, Any]]:
        with self._cond:
            return next((r for r in self.by_rank[rank] if r.get("event") == "exit"), None)

    def events(self, rank: int) -> List[Dict[str, Any]]:
        """Rank ``rank``'s event trail so far (read on incrementally)."""
        if not self.tails:
            return []
        self.tails[rank].read()
        return self.tails[rank].records

    def poll_events(self) -> None:
        for tail in self.tails:
            tail.read()

    def event_trail(self, rank: int) -> List[Dict[str, Any]]:
        """The whole event trail of ``rank``, read afresh (``linkescape.events.read_events``)."""
        from ..common.events import read_events

        if not self.events_tmpl:
            return []
        path = self.events_tmpl.replace("{rank}", str(rank))
        return read_events(path) if os.path.exists(path) else []

    # ------------------------------------------------------------ waiting
    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def dead(self) -> List[int]:
        """Ranks whose process ended."""
        return [r for r, p in enumerate(self.procs) if p.poll() is not None]

    def _tails_text(self, lines: int) -> List[str]:
        return ["".join(self.stderr_tail(r, 1 << 20).splitlines(True)[-lines:]) for r in range(self.world)]

    def wait(self, pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.02) -> None:
        """Until ``pred()``; TimeoutError after ``timeout`` s, RuntimeError once a rank ended."""
        deadline = time.monotonic() + timeout
        while not pred():
            if self.dead():
                raise RuntimeError(f"rank(s) {self.dead()} exited while waiting for {what}; stderr tails: "
                                   f"{self._tails_text(20)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout:.0f}s; stderr tails: {self._tails_text(5)}")
            with self._cond:
                self._cond.wait(poll)

    def wait_for(self, event: str, rank: Optional[int] = None, iter: Optional[int] = None,  # noqa: A002
                 timeout: float = 60.0) -> Dict[str, Any]:
        """The next record matching that no earlier call returned (records seen on the way are kept)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for rec in self.records:
                    if not rec.get("_taken") and _matches(rec, event, rank, iter):
                        rec["_taken"] = True
                        return rec
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {event} (rank={rank}, iter={iter}) within {timeout}s; "
                                       f"stderr: {self.stderr}")
                self._cond.wait(min(left, 0.2))

    # ------------------------------------------------------------ ending
    def stop(self) -> None:
        """Ask the ranks to stop (together): the stop file they poll."""
        os.close(open_private(self.stop_file, "a"))

    def finish(self, timeout: float = 120.0, *, stop: bool = True, dump_wait: float = 1.0) -> List[Dict[str, Any]]:
        """Stop the ranks (``stop``: touch the stop file) and wait for every ``exit`` record.

        A rank with no ``exit`` record after ``timeout`` s: *hung* if still
        running (its stacks are asked for with :attr:`dump_signal`, then it is
        killed), else it *died*. Returns one exit record per rank; missing
        ones are made up: ``{"event": "exit", "rank", "hung", "wrong": None,
        "error": "hung" | "died (exit N)", "stderr"}``.
        """
        if stop:
            self.stop()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.exit_record(r) is not None for r in range(self.world)):
                break
            if all(p.poll() is not None for p in self.procs):
                self._drain()
                break
            with self._cond:
                self._cond.wait(0.05)
        hung = [r for r in range(self.world) if self.exit_record(r) is None and self.procs[r].poll() is None]
        for r in hung:
            self.hung[r] = True
            if self.dump_signal is not None:
                try:
                    self.procs[r].send_signal(self.dump_signal)
                except ProcessLookupError:
                    pass
        if hung and self.dump_signal is not None:
            time.sleep(dump_wait)  # faulthandler writes the stacks
        died = {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}
        self.kill()
        self._drain()
        self.poll_events()
        exits = []
        for r in range(self.world):
            ex = self.exit_record(r)
            if ex is None:
                ex = {"event": "exit", "rank": r, "hung": self.hung[r], "wrong": None,
                      "error": "hung" if self.hung[r] else f"died (exit {died.get(r)})"}
            if ex.get("error"):
                ex["stderr"] = self.stderr_tail(r, 4000)
            exits.append(ex)
        return exits

    def wait_exit(self, timeout: Optional[float] = None, grace: float = 30.0) -> int:
        """Wait for every rank to end; the worst exit status (0 when all succeeded).

        Once a rank failed, the others get ``grace`` s before they are stopped
        (their peer is gone; they would wait until some collective times out)
        and the failure itself is reported, not theirs. A job still running
        after ``timeout`` s is stopped: 124, as timeout(1).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        kill_at: Optional[float] = None
        victims: List[int] = []
        while True:
            states = [p.poll() for p in self.procs]
            if None not in states:
                break
            now = time.monotonic()
            if kill_at is None and any(rc not in (None, 0) for rc in states):
                kill_at = now + grace
            if deadline is not None and now >= deadline:
                self.kill()
                self._drain()
                return 124
            if kill_at is not None and now >= kill_at:
                victims = [r for r, rc in enumerate(states) if rc is None]
                self.kill()
                break
            time.sleep(0.05)
        self._drain()
        own = [r for r in range(self.world) if r not in victims] or list(range(self.world))
        return max(exit_status(self.procs[r].returncode) for r in own)

    def _drain(self, timeout: float = 5.0) -> None:
        """Let the readers take the last lines of ended ranks."""
        end = time.monotonic() + timeout
        for th in self._threads:
            th.join(max(0.0, end - time.monotonic()))

    def kill(self, wait: float = 5.0) -> None:
        """Stop every rank still running: SIGTERM, then SIGKILL (to its session when it has one)."""
        for sig in ((signal.SIGTERM, signal.SIGKILL) if self.session else (signal.SIGKILL,)):
            alive = [p for p in self.procs if p.poll() is None]
            if not alive:
                break
            for p in alive:
                try:
                    if self.session:
                        os.killpg(p.pid, sig)
                    else:
                        p.send_signal(sig)
                except (ProcessLookupError, PermissionError):
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end and any(p.poll() is None for p in alive):
                time.sleep(0.02)
        for p in self.procs:
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Kill what is left; remove the directory if the job made it."""
        self.kill()
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RankJob":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _matches(rec: Mapping[str, Any], event: str, rank: Optional[int], it: Optional[int]) -> bool:
    return (rec.get("event") == event and (rank is None or rec.get("rank") == rank)
            and (it is None or rec.get("iter") == it))


class Job(RankJob):
    """The testbed workload (:mod:`linkescape.testbed.worker`) on every host of ``tb``, or on ``hosts``.

    ``op`` ``iters`` times (or for ``duration`` s), every result checked
    exactly; ``gap`` s between operations, ``async_depth`` small all_reduces in
    flight beside each. Records: ``ready``, ``start``/``done`` per iteration,
    ``exit``; event trails in ``events-R.jsonl`` of the job's directory.
    """

    def __init__(self, tb: Testbed, op: str = "all_reduce", count: int = 1 << 20, iters: int = 10,
                 gap: float = 0.0, duration: float = 0.0, dtype: str = "float32", env: Optional[Dict] = None,
                 hosts: Optional[Sequence[int]] = None, async_depth: int = 0) -> None:
        hosts = list(hosts) if hosts is not None else list(range(tb.hosts))
        workdir = tempfile.mkdtemp(prefix="linkescape-job-")
        self.store = os.path.join(workdir, "store")
        events = os.path.join(workdir, "events-{rank}.jsonl")
        world = len(hosts)
        commands = [[sys.executable, "-m", "linkescape.testbed.worker", "--rank", str(rank), "--world", str(world),
                     "--store", self.store, "--op", op, "--count", str(count), "--iters", str(iters),
                     "--gap", str(gap), "--duration", str(duration), "--dtype", dtype,
                     "--async-depth", str(async_depth)] for rank in range(world)]
        base = {"LINKESCAPE_RAILS": ",".join(tb.rail_nics), "LINKESCAPE_EVENTS": events, "PYTHONUNBUFFERED": "1"}
        super().__init__(commands, tb=tb, hosts=hosts, env={**base, **(env or {})}, workdir=workdir, events=events)
        self._own_dir = True
        self.events_path = events

    def finish(self, timeout: float = 120.0, **kw: Any) -> List[Dict[str, Any]]:
        """Wait for every rank's ``exit`` (the workload ends by itself); a rank that hangs is reported and killed."""
        kw.setdefault("stop", False)
        return super().finish(timeout, **kw)


__all__ = ["RankJob", "Job", "Tail", "read_jsonl", "exit_status"]
