"""The chaos soak: a testbed, one rank per host, random overlapping faults, an exact check of everything.

:func:`run_chaos` builds a throwaway testbed (``hosts`` x ``rails`` veth rails
shaped to ``rate``), starts :mod:`linkescape.chaos.worker` in every host,
waits for the ranks to run, then plays the fault schedule (random from the
seed, or a replayed one) through the real testbed injector while it shows
live progress. When the schedule is over (every fault repaired) the ranks
stop together; a rank that does not is hung (stacks dumped, killed). The run
directory keeps everything: ``schedule.json``, ``faults.jsonl`` (what was
applied, when), ``ops-R.jsonl``, ``events-R.jsonl``, ``log-R.txt``,
``stderr-R.txt`` and ``report.json``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from .. import jsonl
from ..faults import KINDS, ISOLATE_BOUND, Schedule, ScheduleRunner, TestbedInjector, random_schedule
from . import workload

Say = Callable[[str], None]


@dataclass
class ChaosOptions:
    hosts: int = 4
    rails: int = 2
    rate: Optional[str] = "1gbit"
    duration: float = 600.0
    seed: int = 1
    json_path: Optional[str] = None
    out: Optional[str] = None  #: run directory (default: a new one under /tmp)
    kinds: Tuple[str, ...] = KINDS
    interval: float = 1.0  #: mean seconds between fault starts
    isolate_bound: float = ISOLATE_BOUND
    max_active: int = 3
    hold: Tuple[float, float] = (0.5, 4.0)  #: a fault (not isolate/cross/flap) lasts between these, s
    schedule: Optional[Schedule] = None  #: replay this plan instead of drawing one
    max_bytes: int = workload.MAX_BYTES
    op_timeout: float = 60.0  #: LINKESCAPE_TIMEOUT of the ranks: a stuck operation becomes CommTimeout
    hang_s: float = 60.0  #: a step outstanding this long (or a rank that does not exit) is hung
    env: Dict[str, str] = field(default_factory=dict)
    live: Optional[bool] = None
    command: Optional[str] = None


def plan(opts: ChaosOptions) -> Schedule:
    """The schedule of this run: the replayed one, or the seed's."""
    if opts.schedule is not None:
        s = opts.schedule
        if (s.hosts, s.rails) != (opts.hosts, opts.rails):
            from ..faults import ScheduleError

            raise ScheduleError(f"the schedule is for {s.hosts} hosts x {s.rails} rails, "
                                f"not {opts.hosts} x {opts.rails}")
        return s
    return random_schedule(opts.seed, opts.duration, opts.hosts, opts.rails, kinds=opts.kinds,
                           interval=opts.interval, isolate_bound=opts.isolate_bound, max_active=opts.max_active,
                           hold=opts.hold)


def run_dir(opts: ChaosOptions) -> str:
    path = opts.out or os.path.join("/tmp", f"linkescape-chaos-s{opts.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    return path


def library_version() -> Dict[str, Any]:
    """The package version, and the git commit (and uncommitted files) of its source tree, if any."""
    import subprocess

    import linkescape

    src = os.path.dirname(os.path.abspath(linkescape.__file__))
    out: Dict[str, Any] = {"version": getattr(linkescape, "__version__", None), "path": src}
    try:
        head = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
            st = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", "."], capture_output=True,
                                text=True, timeout=10)
            out["dirty"] = [line[3:] for line in st.stdout.splitlines() if line[:2].strip() and line.endswith(".py")]
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_chaos(opts: ChaosOptions, say: Say = print) -> Dict[str, Any]:
    """Run the soak; returns the report dict (``report["exit_code"]`` is 0 only when everything held)."""
    from ..config import Config
    from ..testbed.netns import require_nft, require_root
    from .report import build_report, collect

    require_root("linkescape chaos")
    schedule = plan(opts)
    if any(iv[4] in ("blackhole", "lossy") for iv in schedule.intervals()):
        require_nft()
    rdir = run_dir(opts)
    schedule.save(os.path.join(rdir, "schedule.json"))
    events_tmpl = os.path.join(rdir, "events-{rank}.jsonl")
    env = {"LINKESCAPE_EVENTS": events_tmpl, "LINKESCAPE_TIMEOUT": str(opts.op_timeout), "PYTHONUNBUFFERED": "1",
           "LINKESCAPE_DEBUG": "INFO", "LINKESCAPE_DEBUG_FILE": os.path.join(rdir, "log-{rank}.txt"), **opts.env}
    cfg = Config.from_env({k: v for k, v in {**os.environ, **env}.items() if k.startswith("LINKESCAPE_")
                           and k not in ("LINKESCAPE_RAILS",)})
    say(f"linkescape chaos: {opts.hosts} hosts x {opts.rails} rails at {opts.rate or 'unshaped'}, "
        f"{schedule.duration:.0f} s, seed {schedule.seed}, {len(schedule.faults)} faults "
        f"({', '.join(f'{k} {v}' for k, v in schedule.counts().items())}); run directory {rdir}")
    t_start = time.time()
    load_start = os.getloadavg()
    soak = _Soak(opts, schedule, rdir, env, say)
    soak.run()
    t_end = time.time()
    data = collect(opts=opts, schedule=schedule, ranks=soak.ranks, runner=soak.runner, cfg=cfg, rdir=rdir,
                   events_tmpl=events_tmpl, t_start=t_start, t_end=t_end, hung_during=soak.hung_during,
                   setup_error=soak.setup_error)
    data["tcp"] = soak.tcp
    data["library"] = library_version()
    data["machine"] = {"cpus": os.cpu_count(), "load_start": load_start, "load_end": os.getloadavg()}
    with open(os.path.join(rdir, "run.json"), "w") as fh:
        json.dump(data, fh, default=str)
    report = build_report(data, schedule)
    report["options"] = {k: v for k, v in asdict(opts).items() if k not in ("schedule",)}
    report["command"] = opts.command or " ".join(shlex.quote(a) for a in sys.argv)
    for path in [os.path.join(rdir, "report.json")] + ([opts.json_path] if opts.json_path else []):
        with open(path, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return report


class _Soak:
    """One soak on a throwaway testbed: the ranks, the fault schedule played under them, and what went wrong."""

    def __init__(self, opts: ChaosOptions, schedule: Schedule, rdir: str, env: Dict[str, str], say: Say) -> None:
        self.opts, self.schedule, self.rdir, self.env, self.say = opts, schedule, rdir, env, say
        self.ranks = None
        self.runner: Optional[ScheduleRunner] = None
        self.hung_during: Optional[str] = None
        self.setup_error: Optional[str] = None
        self.tcp: list = []  # [wall time, per rank TCP counters] every 0.5 s

    def run(self) -> None:
        from ..testbed.netns import temporary_testbed
        from .ranks import Ranks

        opts = self.opts
        with temporary_testbed(opts.hosts, opts.rails, rate=opts.rate, prefix="ch") as tb:
            self.env["LINKESCAPE_RAILS"] = ",".join(tb.rail_nics)
            try:
                self.ranks = Ranks(tb, list(range(opts.hosts)), self.rdir, seed=opts.seed, max_bytes=opts.max_bytes,
                                   env=self.env)
                self.ranks.wait_ready()
                fault_log = os.path.join(self.rdir, "faults.jsonl")
                open(fault_log, "w").close()
                self.runner = ScheduleRunner(self.schedule, TestbedInjector(tb),
                                             on_step=lambda rec: jsonl.append(fault_log, rec))
                self._watch(time.time() + 0.2)
                self.runner.stop()
                self.tcp.append([time.time(), self.ranks.tcp_counters()])
                self.ranks.finish(timeout=opts.hang_s + 30.0)
            except (RuntimeError, TimeoutError) as exc:
                self.setup_error = str(exc)
                self.say(f"linkescape chaos: {exc}")
            finally:
                if self.runner is not None:
                    self.runner.stop()
                if self.ranks is not None:
                    self.ranks.kill()

    def _watch(self, t0: float) -> None:
        """Play the schedule from ``t0`` with live progress until it is over, a rank ended, or one hung."""
        from .live import LiveView

        ranks, runner, opts = self.ranks, self.runner, self.opts
        runner.start(t0)
        with LiveView(seed=opts.seed, duration=self.schedule.duration, live=opts.live, say=self.say) as view:
            while True:
                now = time.time()
                if now - (self.tcp[-1][0] if self.tcp else 0.0) >= 0.5:
                    self.tcp.append([now, ranks.tcp_counters()])
                with ranks.lock:
                    view.update(now - t0, ranks.states, [f.label for f in runner.active()],
                                len(runner.fault_times()) - len(runner.active()))
                if not runner.running and now >= t0 + self.schedule.duration:
                    return
                if ranks.dead():
                    return  # a rank ended (an error): the others cannot go on without it
                stuck = [s.rank for s in ranks.states if (s.outstanding(now) or 0.0) > opts.hang_s]
                if stuck:
                    self.hung_during = f"rank(s) {stuck} had a step outstanding for more than {opts.hang_s:.0f} s"
                    return
                time.sleep(0.25)


__all__ = ["ChaosOptions", "run_chaos", "plan"]
