"""The demo's controller: testbed (or loopback), the training runs, and what runs around them.

One demo is two runs of the same training job (:mod:`linkescape.demo.train`):

* the *faulty* run, during which a cable is cut (host 1 rail 0), an optic
  blackholed (host 2 rail 0) and a link flapped (host 3 rail 0), each
  repaired before the next, then hosts 1 and 2 lose different rails at once
  for ``cross_hold`` s (10: a *cross*; they share no rail and a third host
  relays their traffic), while every host NIC's transmit counter is
  sampled every 50 ms and the ranks' event trails are tailed (``faults``
  chooses which of these faults, in this order);
* the *reference* run, with no faults, to compare the per-step losses and
  the final parameters bit for bit.

On a testbed (root, network namespaces) the faults are real: veth carrier
loss, nftables drop tables, and the ranks are one torchrun per host. Without
one, the ranks run here on loopback rails with torchrun's environment and
the faults are emulated inside the processes (:mod:`linkescape.demo.emulated`).
Either way the ranks are a shared :class:`~linkescape.testbed.job.RankJob`.
The parts: :mod:`.faultplan` (the faults and who plays them),
:mod:`.sampling` (NIC counters), :mod:`.live` (what the display shows).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..common.events import expand_path
from ..testbed.job import RankJob
from .faultplan import CROSS_HOLD, KINDS, EmulatedInjector, Injector, PlayedFault, TestbedInjector, fault_window
from .live import FaultRunner, LiveState, Monitor
from .model import DEFAULT_SIZE
from .sampling import FileTxSampler, testbed_sampler

#: that the three single-NIC faults, each with its repair and failback, fit in it (a cross adds its own)
MIN_FAULT_WINDOW = 16.0
#: the demo's silent-loss timeout (the torch backend's default is 3 s)


@dataclass
class DemoOptions:
    out: str = "./linkescape-demo"
    steps: int = 200
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    emulate: bool = False
    reference: bool = True
    quiet: bool = False
    model_size: str = DEFAULT_SIZE
    seed: int = 1234
    live: Optional[bool] = None  # None: a rich Live display when stdout is a terminal
    faults: Tuple[str, ...] = KINDS  #: the faults of the faulty run, played in this order (cross last)
    cross_hold: float = CROSS_HOLD  #: seconds the cross lasts

    @property
    def fault_window(self) -> float:
        """How long the faulty run's training lasts at least, for every fault, repair and failback to fit."""
        return max(MIN_FAULT_WINDOW if [k for k in self.faults if k != "cross"] else 0.0,
                   fault_window(self.faults, self.cross_hold, self.hosts, self.rails))


class DemoError(RuntimeError):
    pass


class TestbedUnavailable(DemoError):
    """No testbed could be built here; the demo falls back to emulated faults."""

    __test__ = False

# ------------------------------------------------------------------ running the job
@dataclass
class RunResult:
    name: str
    dir: str
    rc: Optional[int] = None
    wall_s: float = 0.0
    error: Optional[str] = None
    faults: List[PlayedFault] = field(default_factory=list)
    samples: List[Tuple[float, List[List[int]]]] = field(default_factory=list)
    planned_duration: Optional[float] = None
    fault_error: Optional[str] = None


def _prepare_run_dir(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.join(path, "events"), exist_ok=True)


def job_env(run_dir: str) -> Dict[str, str]:
    env = {"LINKESCAPE_EVENTS": os.path.join(os.path.abspath(run_dir), "events", "rank{rank}.jsonl"),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # the library's default silent timeout applies
    return env


def train_args(opts: DemoOptions, run_dir: str, min_duration: float = 0.0) -> List[str]:
    args = ["-m", "linkescape.demo.train", "--out", os.path.abspath(run_dir), "--steps", str(opts.steps),
            "--model-size", opts.model_size, "--seed", str(opts.seed)]
    if min_duration:
        args += ["--min-duration", f"{min_duration:g}"]
    return args


def run_timeout(opts: DemoOptions) -> float:
    return 180.0 + 3.0 * opts.steps


def _run_job(start_job: Callable[[], int], state: LiveState, run: RunResult, sampler, injector: Optional[Injector],
             opts: DemoOptions, display, min_duration: float) -> RunResult:
    """Run one training job with monitor, sampler and (optionally) the fault runner around it."""
    stop = threading.Event()
    events = [expand_path(os.path.join(run.dir, "events", "rank{rank}.jsonl"), r) for r in range(opts.hosts)]
    monitor = Monitor(state, os.path.join(run.dir, "steps.jsonl"), events, sampler=sampler,
                      on_tick=display.refresh if display is not None else None)
    faults = (FaultRunner(injector, state, opts.hosts, opts.rails, min_duration, stop, kinds=opts.faults,
                          cross_hold=opts.cross_hold) if injector else None)
    t0 = time.time()
    if sampler is not None:
        sampler.start()
    monitor.start()
    if faults is not None:
        faults.start()
    try:
        run.rc = start_job()
    finally:
        stop.set()
        if faults is not None:
            faults.join(15.0)
            run.faults = faults.faults
            run.fault_error = None if faults.error is None else f"{type(faults.error).__name__}: {faults.error}"
            run.planned_duration = state.planned_duration
        if sampler is not None:
            sampler.stop()
            run.samples = sampler.series()
        monitor.stop()
        run.wall_s = time.time() - t0
        with state.lock:
            state.finished = True
        if display is not None:
            display.refresh()
    return run


def _play_runs(opts: DemoOptions, display_factory, title: str, hosts: int, rails: int,
               prepare: Callable[[int, bool, str, float], Tuple[Callable[[], int], Any, Optional[Injector]]]
               ) -> List[RunResult]:
    """The faulty run, then (unless ``--no-reference``) the fault-free one, each in its directory with its live
    view; ``prepare(k, faulty, run_dir, min_duration)`` gives a run its job, sampler and injector."""
    results: List[RunResult] = []
    plan = [("faulty", True)] + ([("reference", False)] if opts.reference else [])
    for k, (name, faulty) in enumerate(plan):
        run_dir = os.path.join(opts.out, name)
        _prepare_run_dir(run_dir)
        run = RunResult(name, run_dir)
        state = LiveState(hosts, rails, opts.steps, title, name)
        display = display_factory(state)
        min_duration = opts.fault_window if faulty else 0.0
        job, sampler, injector = prepare(k, faulty, run_dir, min_duration)
        with display:
            _run_job(job, state, run, sampler, injector, opts, display, min_duration)
        results.append(run)
        if run.rc != 0 and faulty:
            break  # no point in a reference for a run that failed
    return results


# -- testbed
def testbed_runs(opts: DemoOptions, display_factory) -> Tuple[Dict[str, Any], List[RunResult]]:
    from ..testbed.netns import TestbedError, make_temporary, release

    if opts.rails < 2:
        raise DemoError("the demo needs at least 2 rails: a rail that fails needs a backup")
    try:
        tb = make_temporary(opts.hosts, opts.rails, rate=opts.rate, prefix="demo")
    except TestbedError as exc:
        raise TestbedUnavailable(f"cannot build a testbed: {exc}") from exc
    try:
        info = {"mode": "testbed", "testbed": {"name": tb.name, "hosts": tb.hosts, "rails": tb.rails,
                                               "rate": tb.rate}}
        title = (f"linkescape demo: {tb.hosts} hosts x {tb.rails} rails at {tb.rate or 'unshaped'} "
                 f"(testbed {tb.name})")

        def prepare(k: int, faulty: bool, run_dir: str, min_duration: float):
            def job() -> int:
                return _testbed_job(tb, train_args(opts, run_dir, min_duration), job_env(run_dir),
                                    os.path.join(run_dir, "train.log"), master_port=29500 + k,
                                    timeout=run_timeout(opts))

            return job, testbed_sampler(tb) if faulty else None, TestbedInjector(tb) if faulty else None

        results = _play_runs(opts, display_factory, title, tb.hosts, tb.rails, prepare)
    finally:
        release(tb)  # always torn down: failure, Ctrl-C (KeyboardInterrupt) or success
    return info, results


# -- emulated (loopback)
def _local_job(argv: List[str], world: int, env: Dict[str, str], log_path: str, timeout: float) -> int:
    """``world`` ranks as local processes with torchrun's environment; the worst exit status."""
    from linkescape.torch.testing import reserved_port

    with reserved_port() as port:  # rank 0's TCPStore listens on it
        return _local_ranks(argv, world, env, log_path, timeout, port)


def _local_ranks(argv: List[str], world: int, env: Dict[str, str], log_path: str, timeout: float,
                 port: int) -> int:

    def rank_env(rank: int) -> Dict[str, str]:
        return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "GROUP_RANK": "0"}

    open(log_path, "w").close()
    job = RankJob([[sys.executable, *argv] for _ in range(world)], env=env, rank_env=rank_env,
                  workdir=os.path.dirname(os.path.abspath(log_path)), log=log_path, session=True)
    try:
        return job.wait_exit(timeout=timeout, grace=10.0)
    finally:
        job.close()


def _testbed_job(tb, script: List[str], env: Dict[str, str], log_path: str, *, master_port: int,
                 timeout: float) -> int:
    """One torchrun per testbed host (rendezvous over the management network); the worst exit status."""
    from ..testbed.launch import job_env as host_env
    from ..testbed.launch import torchrun_argv

    n = tb.hosts
    open(log_path, "w").close()
    job = RankJob([torchrun_argv(tb, i, script, nnodes=n, master_port=master_port) for i in range(n)], tb=tb,
                  rank_env=lambda i: host_env(tb, i, env), workdir=os.path.dirname(os.path.abspath(log_path)),
                  log=log_path, session=True)
    try:
        return job.wait_exit(timeout=timeout, grace=10.0)
    finally:
        job.close()


def emulated_runs(opts: DemoOptions, display_factory, reason: str) -> Tuple[Dict[str, Any], List[RunResult]]:
    if opts.rails < 2:
        raise DemoError("the demo needs at least 2 rails: a rail that fails needs a backup")
    if opts.rails > 250:
        raise DemoError("emulated mode has at most 250 loopback rails")
    rails = ",".join(f"127.0.0.{r + 1}" for r in range(opts.rails))
    info = {"mode": "emulated", "emulated_reason": reason,
            "testbed": {"name": None, "hosts": opts.hosts, "rails": opts.rails, "rate": None,
                        "rail_addresses": rails.split(",")}}
    title = f"linkescape demo (EMULATED faults): {opts.hosts} ranks x {opts.rails} loopback rails ({rails})"

    def prepare(k: int, faulty: bool, run_dir: str, min_duration: float):
        argv = train_args(opts, run_dir, min_duration)
        env = job_env(run_dir)
        env["LINKESCAPE_RAILS"] = rails
        sampler = injector = None
        if faulty:
            control = os.path.join(os.path.abspath(run_dir), "control")
            os.makedirs(control, exist_ok=True)
            rail_bytes = os.path.join(os.path.abspath(run_dir), "rails", "rank{rank}.jsonl")
            os.makedirs(os.path.dirname(rail_bytes), exist_ok=True)
            argv += ["--control", control, "--rail-bytes", rail_bytes]
            injector = EmulatedInjector(control)
            sampler = FileTxSampler([rail_bytes.replace("{rank}", str(r)) for r in range(opts.hosts)], opts.rails)

        def job() -> int:
            return _local_job(argv, opts.hosts, env, os.path.join(run_dir, "train.log"), run_timeout(opts))

        return job, sampler, injector

    results = _play_runs(opts, display_factory, title, opts.hosts, opts.rails, prepare)
    return info, results


def testbed_unavailable() -> Optional[str]:
    """Why no testbed can be built here (None when it probably can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "not running as root (the testbed needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if shutil.which("nft") is None:
        return "nftables ('nft') is not installed (blackhole faults need it)"
    return None


__all__ = ["DemoOptions", "DemoError", "RunResult", "testbed_runs", "emulated_runs", "testbed_unavailable",
           "TestbedUnavailable", "job_env", "train_args", "MIN_FAULT_WINDOW"]
