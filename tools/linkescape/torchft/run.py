"""Training under torchft on the testbed, through both kinds of fault: one run.

4 replica groups (one process each, :mod:`linkescape.torchft.train`), one per testbed host (2 rails,
1 Gbit/s), torchft's lighthouse on host 0's management address, and the fault schedule of
:data:`SCHEDULE`, played once all the replicas train together:

* a cable cut (host 1 rail 0), a blackholed optic (host 2 rail 0), a flap (host 3 rail 0): faults that
  leave a path;
* host 3 loses every link, its two rails and its management link (``whole="links"``: its top-of-rack
  switch fails), or its process is killed (``whole="kill"``), and is repaired (the links come back, or
  the process is started again) ``hold`` seconds later: it rejoins through torchft's recovery.

The backend is linkescape's group (on both rails) or torchft's Gloo group (on rail 0, where a Gloo job
would run). :func:`run_training` returns the run's records; :mod:`.analysis` turns them into the report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

#: (seconds after every replica trains, what, host, rail, seconds held); a flap's hold is its cycles x 1 s
SCHEDULE = (
    (4.0, "cut", 1, 0, 4.0),
    (14.0, "blackhole", 2, 0, 4.0),
    (24.0, "flap", 3, 0, 4.0),
    (34.0, "host", 3, None, 15.0),
)
#: after the last repair: time for the host to rejoin and train with the others
TAIL = 15.0
LIGHTHOUSE_PORT = 29510


@dataclass
class Options:
    backend: str = "linkescape"  # or "gloo"
    whole: str = "links"  # how host 3 is lost: "links" (every link cut) or "kill" (its process killed)
    out: str = "./linkescape-torchft"
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    pace: float = 0.2  # seconds a step takes at least
    timeout: float = 10.0  # torchft's timeout (calls, configure)
    #: torchft's quorum timeout: longer than a failed configure (``timeout``), so that replicas that wait for a
    #: quorum do not give up while the others finish a configure that failed, and miss them
    quorum_timeout: float = 30.0
    heartbeat_timeout_ms: int = 2000  # the lighthouse's
    join_timeout_ms: int = 1000
    start_timeout: float = 120.0


@dataclass
class Played:
    what: str
    host: int
    rail: Optional[int]
    at: float  # wall time the fault was in effect
    repaired: Optional[float] = None
    error: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)


def lighthouse_binary() -> str:
    found = shutil.which("torchft_lighthouse") or os.path.join(os.path.dirname(sys.executable),
                                                               "torchft_lighthouse")
    if not os.access(found, os.X_OK):
        from ..common.extras import MissingExtra

        raise MissingExtra("the torchft run needs torchft's lighthouse (torchft_lighthouse), which is not "
                           "installed: pip install 'linkescape[torchft]'")
    return found


class _Replicas:
    """The replica processes, one per host, each in its own session (a kill reaches all of it)."""

    def __init__(self, tb, opts: Options, run_dir: str, lighthouse: str) -> None:
        self.tb, self.opts, self.dir, self.lighthouse = tb, opts, run_dir, lighthouse
        self.procs: Dict[int, subprocess.Popen] = {}
        self.stop_file = os.path.join(run_dir, "stop-at")

    def start(self, host: int) -> None:
        from ..testbed.launch import job_env

        tb, o = self.tb, self.opts
        argv = [sys.executable, "-m", "linkescape.torchft.train", "--replica", str(host), "--backend", o.backend,
                "--lighthouse", self.lighthouse, "--addr", tb.mgmt_addr(host), "--out", self.dir,
                "--pace", str(o.pace), "--timeout", str(o.timeout), "--quorum-timeout", str(o.quorum_timeout),
                "--stop-file", self.stop_file]
        extra = {"OMP_NUM_THREADS": "1", "LINKESCAPE_EVENTS": os.path.join(self.dir, "events", f"r{host}.jsonl")}
        env = job_env(tb, host, extra)
        if o.backend == "gloo":
            env["GLOO_SOCKET_IFNAME"] = "r0"  # Gloo has one NIC: the first rail
        log = open(os.path.join(self.dir, f"replica{host}.log"), "ab")
        self.procs[host] = tb.popen(host, argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        log.close()

    def kill(self, host: int) -> None:
        p = self.procs.get(host)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def wait_all(self, timeout: float) -> Dict[int, Optional[int]]:
        end = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return {h: p.poll() for h, p in self.procs.items()}

    def close(self) -> None:
        for h in list(self.procs):
            self.kill(h)


def _records(run_dir: str, host: int) -> List[Dict[str, Any]]:
    path = os.path.join(run_dir, f"steps-r{host}.jsonl")
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break  # a line being written
    except FileNotFoundError:
        pass
    return out


def _wait_all_together(run_dir: str, hosts: int, timeout: float) -> float:
    """Wall time once every replica committed a step with all of them in its quorum."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ok = 0
        for h in range(hosts):
            if any(r.get("committed") and r.get("participants") == hosts for r in _records(run_dir, h)):
                ok += 1
        if ok == hosts:
            return time.time()
        time.sleep(0.2)
    raise TimeoutError(f"the {hosts} replicas did not train together within {timeout:.0f} s")


def _play(tb, reps: _Replicas, opts: Options, t0: float, played: List[Played], stop: threading.Event) -> None:
    from ..testbed import faults as tf

    for at, what, host, rail, hold in SCHEDULE:
        if stop.wait(max(0.0, t0 + at - time.time())):
            return
        p = Played(what, host, rail, time.time())
        played.append(p)
        try:
            if what == "cut":
                tf.cut(tb, host, rail)
                p.at = time.time()
                stop.wait(hold)
                tf.repair(tb, host, rail, "cut")
            elif what == "blackhole":
                tf.blackhole(tb, host, rail)
                p.at = time.time()
                stop.wait(hold)
                tf.repair(tb, host, rail, "blackhole")
            elif what == "flap":
                tf.flap(tb, host, rail, 1.0, count=int(hold))
            elif opts.whole == "kill":
                p.at = time.time()  # a step in flight fails at once
                reps.kill(host)
                p.extra["how"] = "process killed"
                stop.wait(hold)
                reps.start(host)
            else:
                p.at = time.time()
                for r in list(range(tb.rails)) + ["mgmt"]:
                    tf.cut(tb, host, r)
                p.extra["how"] = "every link cut (rails and management)"
                stop.wait(hold)
                for r in list(range(tb.rails)) + ["mgmt"]:
                    tf.repair(tb, host, r, "cut")
            p.repaired = time.time()
        except Exception as exc:  # noqa: BLE001 - the report says so
            p.error = f"{type(exc).__name__}: {exc}"


def run_training(tb, opts: Options, run_dir: str) -> Dict[str, Any]:
    """One run on testbed ``tb``: returns ``{"options", "faults", "t_together", "records", "finals", ...}``."""
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(os.path.join(run_dir, "events"))
    lh_addr = f"{tb.mgmt_addr(0)}:{LIGHTHOUSE_PORT}"
    lh_log = open(os.path.join(run_dir, "lighthouse.log"), "ab")
    lighthouse = tb.popen(0, [lighthouse_binary(), "--min_replicas", "2", "--bind", lh_addr,
                              "--join_timeout_ms", str(opts.join_timeout_ms),
                              "--heartbeat_timeout_ms", str(opts.heartbeat_timeout_ms), "--quorum_tick_ms", "100"],
                          stdout=lh_log, stderr=subprocess.STDOUT, start_new_session=True)
    lh_log.close()
    reps = _Replicas(tb, opts, run_dir, f"http://{lh_addr}")
    played: List[Played] = []
    stop = threading.Event()
    result: Dict[str, Any] = {"options": asdict(opts), "testbed": {"name": tb.name, "hosts": tb.hosts,
                                                                  "rails": tb.rails, "rate": tb.rate}}
    player = None
    try:
        time.sleep(0.5)  # the lighthouse listens
        for h in range(opts.hosts):
            reps.start(h)
        t0 = _wait_all_together(run_dir, opts.hosts, opts.start_timeout)
        result["t_together"] = t0
        player = threading.Thread(target=_play, args=(tb, reps, opts, t0, played, stop), daemon=True)
        player.start()
        last = max(at + hold for at, _, _, _, hold in SCHEDULE)
        player.join(last + 60.0)
        time.sleep(TAIL)
        # every replica stops at the same step, a little ahead of the furthest
        steps = [max((r.get("step", 0) for r in _records(run_dir, h)), default=0) for h in range(opts.hosts)]
        with open(reps.stop_file + ".tmp", "w") as f:
            f.write(str(max(steps) + 10))
        os.replace(reps.stop_file + ".tmp", reps.stop_file)
        result["stop_step"] = max(steps) + 10
        result["exit"] = reps.wait_all(60.0)
    finally:
        stop.set()
        if player is not None:
            player.join(30)
        reps.close()
        if lighthouse.poll() is None:
            os.killpg(lighthouse.pid, signal.SIGKILL)
            lighthouse.wait(10)
    result["faults"] = [asdict(p) for p in played]
    result["records"] = {h: _records(run_dir, h) for h in range(opts.hosts)}
    finals = {}
    for h in range(opts.hosts):
        try:
            with open(os.path.join(run_dir, f"final-r{h}.json")) as f:
                finals[h] = json.load(f)
        except (OSError, ValueError):
            finals[h] = None
    result["finals"] = finals
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


__all__ = ["Options", "SCHEDULE", "run_training", "lighthouse_binary"]
