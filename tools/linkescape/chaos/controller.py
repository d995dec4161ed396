"""The chaos soak: a testbed, one rank per host, random overlapping faults, an exact check of everything.

:func:`run_chaos` builds a throwaway testbed (``hosts`` x ``rails`` veth rails
shaped to ``rate``), starts :mod:`linkescape.chaos.worker` in every host,
waits for the ranks to run, then plays the fault schedule (random from the
seed, or a replayed one) through the real testbed injector while it shows
live progress. When the schedule is over (every fault repaired) the ranks
stop together; a rank that does not is hung (stacks dumped, killed). The run
directory keeps everything: ``schedule.json``, ``faults.jsonl`` (what was
applied, when), ``ops-R.jsonl``, ``events-R.jsonl``, ``log-R.txt``,
``stderr-R.txt``, ``resources.jsonl`` (every rank's RSS, fds and threads every
few seconds), ``report.json`` and ``rss.png``.

A run may have several *parts* (``--policy both``: the first half under
``active-backup``, the second under ``stripe``): each part is a plan of its
own (its own seed, warm-up and tail, so no fault crosses a part's end), played
by ranks started afresh under that part's policy on the same testbed. Steps
and events of every part go to the same files; a part's own job files (store,
stop file, stderr) to ``part-N/``. The report judges the whole run and says
what each part did.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..common.private import open_private_file, private_dir, redact_env, write_private
from ..common import jsonl
from ..faults import (KINDS, ISOLATE_BOUND, Schedule, ScheduleError, ScheduleRunner, TestbedInjector, concatenate,
                      random_schedule, unrelayable_stretches)
from . import workload

Say = Callable[[str], None]

POLICIES = ("active-backup", "stripe")
#: ``--policy auto`` runs both policies in turn from this long on (the library's default below it)
BOTH_FROM_S = 600.0
#: seconds between two samples of every rank's RSS, fds and threads
RESOURCE_INTERVAL = 5.0
#: the default no-path deadline with --cross-hold: the plan's longest stretch without a path and without a
#: relay (or --isolate-bound), plus this
NO_PATH_MARGIN = 5.0


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
    #: ``auto`` (both from BOTH_FROM_S on, else the library's default), ``active-backup``, ``stripe`` or ``both``
    policy: str = "auto"
    #: cross faults last between these (s) instead of less than isolate_bound: a relay must bridge them
    cross_hold: Optional[Tuple[float, float]] = None
    #: LINKESCAPE_NO_PATH_TIMEOUT of the ranks (None: with cross_hold, see NO_PATH_MARGIN; else the library's)
    no_path_timeout: Optional[float] = None
    resource_interval: float = RESOURCE_INTERVAL


def run_policies(opts: ChaosOptions) -> List[Optional[str]]:
    """The policy of each part a drawn plan is split into (None: the library's default)."""
    p = (opts.policy or "auto").lower()
    if p == "auto":
        p = "both" if opts.duration >= BOTH_FROM_S else ""
    if p == "both":
        return list(POLICIES)
    if p and p not in POLICIES:
        raise ScheduleError(f"policy {p!r}: expected active-backup, stripe, both or auto")
    return [p or None]


def plan(opts: ChaosOptions) -> Schedule:
    """The schedule of this run: the replayed one, or the seed's (one plan per part, one after the other)."""
    if opts.schedule is not None:
        s = opts.schedule
        if (s.hosts, s.rails) != (opts.hosts, opts.rails):
            raise ScheduleError(f"the schedule is for {s.hosts} hosts x {s.rails} rails, "
                                f"not {opts.hosts} x {opts.rails}")
        return s
    policies = run_policies(opts)
    n = len(policies)

    def draw(seed: int, duration: float) -> Schedule:
        return random_schedule(seed, duration, opts.hosts, opts.rails, kinds=opts.kinds, interval=opts.interval,
                               isolate_bound=opts.isolate_bound, max_active=opts.max_active, hold=opts.hold,
                               cross_hold=opts.cross_hold)

    if n == 1:
        return draw(opts.seed, opts.duration)
    return concatenate([(draw(opts.seed + i, opts.duration / n), {"policy": pol})
                        for i, pol in enumerate(policies)])


def parts_of(opts: ChaosOptions, schedule: Schedule) -> List[Dict[str, Any]]:
    """The parts to play: the schedule's own (a ``--policy`` given explicitly overrides their policy; ``both``
    needs a plan drawn in parts), or one part under the resolved policy."""
    parts = schedule.parts()
    explicit = (opts.policy or "auto").lower() not in ("auto", "")
    if not schedule.params.get("parts"):
        if explicit and opts.policy.lower() == "both":
            raise ScheduleError("--policy both plays a plan drawn in two parts; this schedule has one "
                                "(draw it with --policy both, or give one policy)")
        parts[0]["policy"] = None if not explicit else opts.policy.lower()
        parts[0]["seed"] = opts.seed
        return parts
    if explicit and opts.policy.lower() != "both":
        for p in parts:
            p["policy"] = opts.policy.lower()
    for i, p in enumerate(parts):
        if p.get("seed") is None:
            p["seed"] = opts.seed + i
    return parts


def no_path_deadline(opts: ChaosOptions, schedule: Schedule) -> Tuple[Optional[float], float]:
    """The ranks' no-path deadline (None: the library's default) and the plan's longest stretch in which
    some pair has neither a common rail nor a relay (what the deadline must outlast)."""
    from .analysis import RELAY_SETTLE

    stretches = unrelayable_stretches(schedule.intervals(), schedule.hosts, schedule.rails, settle=RELAY_SETTLE)
    longest = max((b - a for sp in stretches.values() for a, b in sp), default=0.0)
    if opts.no_path_timeout is not None:
        return opts.no_path_timeout, longest
    if opts.cross_hold is None:
        return None, longest
    return round(max(opts.isolate_bound, longest) + NO_PATH_MARGIN, 3), longest


def run_dir(opts: ChaosOptions) -> str:
    """The run directory: ``--out`` (made 0700, or one of ours that only we
    may write), or a fresh one with an unpredictable name in the temporary
    directory (root writes fixed names in it: issue 48)."""
    if opts.out:
        return private_dir(opts.out)
    return private_dir(None, prefix=f"linkescape-chaos-s{opts.seed}-{time.strftime('%Y%m%d-%H%M%S')}-")


def report_options(opts: ChaosOptions) -> Dict[str, Any]:
    """The options as the report shows them: never a secret (``--env`` values redacted)."""
    out = {k: v for k, v in asdict(opts).items() if k not in ("schedule",)}
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    return out


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
            # both halves of the package: the library (src/) and, in a source checkout, its tools
            halves = [os.path.abspath(p) for p in linkescape.__path__]
            st = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", *halves], capture_output=True,
                                text=True, timeout=10)
            out["dirty"] = [line[3:] for line in st.stdout.splitlines() if line[:2].strip() and line.endswith(".py")]
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_chaos(opts: ChaosOptions, say: Say = print) -> Dict[str, Any]:
    """Run the soak; returns the report dict (``report["exit_code"]`` is 0 only when everything held)."""
    from ..common.config import Config
    from ..testbed.netns import require_nft, require_root
    from .report import build_report, collect, write_plots

    require_root("linkescape chaos")
    schedule = plan(opts)
    parts = parts_of(opts, schedule)
    if any(iv[4] in ("blackhole", "lossy") for iv in schedule.intervals()):
        require_nft()
    rdir = run_dir(opts)
    schedule.save(os.path.join(rdir, "schedule.json"))
    events_tmpl = os.path.join(rdir, "events-{rank}.jsonl")
    deadline, longest = no_path_deadline(opts, schedule)
    env = {"LINKESCAPE_EVENTS": events_tmpl, "LINKESCAPE_TIMEOUT": str(opts.op_timeout), "PYTHONUNBUFFERED": "1",
           "LINKESCAPE_DEBUG": "INFO", "LINKESCAPE_DEBUG_FILE": os.path.join(rdir, "log-{rank}.txt"), **opts.env}
    if deadline is not None:
        env.setdefault("LINKESCAPE_NO_PATH_TIMEOUT", f"{deadline:g}")
    cfg = Config.from_env({k: v for k, v in {**os.environ, **env}.items() if k.startswith("LINKESCAPE_")
                           and k not in ("LINKESCAPE_RAILS",)})
    say(f"linkescape chaos: {opts.hosts} hosts x {opts.rails} rails at {opts.rate or 'unshaped'}, "
        f"{schedule.duration:.0f} s, seed {schedule.seed}, {len(schedule.faults)} faults "
        f"({', '.join(f'{k} {v}' for k, v in schedule.counts().items())}); run directory {rdir}")
    if len(parts) > 1 or parts[0].get("policy"):
        say("  policies: " + "; ".join(f"{p.get('policy') or 'default'} from {p['from']:.0f} s to {p['to']:.0f} s"
                                       for p in parts))
    crosses = [f for f in schedule.faults if f.kind == "cross"]
    if opts.cross_hold is not None or "LINKESCAPE_NO_PATH_TIMEOUT" in env:
        longer = sum(1 for f in crosses if f.hold > cfg.no_path_timeout)
        say(f"  no-path deadline {cfg.no_path_timeout:g} s; {longer} of {len(crosses)} cross faults last longer "
            f"(a relay must bridge them); longest stretch of the plan with neither a path nor a relay for some "
            f"pair: {longest:.1f} s")
        if longest >= cfg.no_path_timeout:
            say("  warning: some pair has neither a path nor a relay for longer than the no-path deadline in this "
                "plan: its ranks will fail with LinkFailure")
    t_start = time.time()
    load_start = os.getloadavg()
    soak = _Soak(opts, schedule, parts, rdir, env, say)
    soak.run()
    t_end = time.time()
    data = collect(opts=opts, schedule=schedule, parts=soak.parts, cfg=cfg, rdir=rdir, events_tmpl=events_tmpl,
                   t_start=t_start, t_end=t_end)
    data["tcp"] = soak.tcp
    data["library"] = library_version()
    data["machine"] = {"cpus": os.cpu_count(), "load_start": load_start, "load_end": os.getloadavg()}
    data["no_path"] = {"deadline_s": cfg.no_path_timeout, "set": deadline is not None,
                       "longest_unrelayable_planned_s": longest,
                       "crosses": len(crosses), "crosses_longer": sum(1 for f in crosses
                                                                     if f.hold > cfg.no_path_timeout)}
    with open_private_file(os.path.join(rdir, "run.json"), "w") as fh:
        json.dump(data, fh, default=str)
    report = build_report(data, schedule)
    report["options"] = report_options(opts)
    report["command"] = opts.command or " ".join(shlex.quote(a) for a in sys.argv)
    pngs = [os.path.join(rdir, "rss.png")]
    if opts.json_path:
        pngs.append(os.path.splitext(opts.json_path)[0] + "-rss.png")
    write_plots(report, pngs)
    for path in [os.path.join(rdir, "report.json")] + ([opts.json_path] if opts.json_path else []):
        write_private(path, json.dumps(report, indent=1, default=str))
    return report


class _Soak:
    """One soak on a throwaway testbed: for each part, its ranks and its faults, and what went wrong."""

    def __init__(self, opts: ChaosOptions, schedule: Schedule, parts: List[Dict[str, Any]], rdir: str,
                 env: Dict[str, str], say: Say) -> None:
        self.opts, self.schedule, self.rdir, self.env, self.say = opts, schedule, rdir, env, say
        self.plan = parts
        self.parts: List[Dict[str, Any]] = []  #: per part played: its ranks, runner, times and troubles
        self.tcp: list = []  # [wall time, per rank TCP counters] every 0.5 s
        self.resource_log = os.path.join(rdir, "resources.jsonl")

    def run(self) -> None:
        from ..testbed.netns import temporary_testbed

        opts = self.opts
        open_private_file(os.path.join(self.rdir, "faults.jsonl"), "w").close()
        open_private_file(self.resource_log, "w").close()
        with temporary_testbed(opts.hosts, opts.rails, rate=opts.rate, prefix="ch") as tb:
            self.env["LINKESCAPE_RAILS"] = ",".join(tb.rail_nics)
            for i, part in enumerate(self.plan):
                self._part(tb, i + 1 if len(self.plan) > 1 else None, part)

    def _part(self, tb, number: Optional[int], part: Dict[str, Any]) -> None:
        from .ranks import Ranks

        opts = self.opts
        env = dict(self.env)
        if part.get("policy"):
            env["LINKESCAPE_POLICY"] = part["policy"]
        rec: Dict[str, Any] = {"part": number, "policy": part.get("policy"), "seed": part.get("seed"),
                               "from": part["from"], "to": part["to"], "ranks": None, "runner": None,
                               "hung_during": None, "setup_error": None, "t_start": time.time(), "t_end": None}
        self.parts.append(rec)
        if number is not None:
            self.say(f"part {number}: policy {part.get('policy') or 'default'}, plan from {part['from']:.0f} s to "
                     f"{part['to']:.0f} s")
        ranks = runner = None
        try:
            ranks = rec["ranks"] = Ranks(tb, list(range(opts.hosts)), self.rdir, seed=int(part.get("seed") or
                                                                                            opts.seed),
                                         max_bytes=opts.max_bytes, env=env, part=number)
            ranks.wait_ready()
            fault_log = os.path.join(self.rdir, "faults.jsonl")
            runner = rec["runner"] = ScheduleRunner(self.schedule.part_schedule(part), TestbedInjector(tb),
                                                    on_step=lambda r: jsonl.append(fault_log, r))
            self._watch(ranks, runner, rec, time.time() + 0.2 - part["from"], part["to"])
            runner.stop()
            self.tcp.append([time.time(), ranks.tcp_counters()])
            ranks.finish(timeout=opts.hang_s + 30.0)
        except (RuntimeError, TimeoutError) as exc:
            rec["setup_error"] = str(exc)
            self.say(f"linkescape chaos: {exc}")
        finally:
            if runner is not None:
                runner.stop()
            if ranks is not None:
                ranks.kill()
            rec["t_end"] = time.time()

    def _sample(self, ranks, number: Optional[int], now: float) -> None:
        jsonl.append(self.resource_log, {"t": now, "part": number, "ranks": ranks.resources()})

    def _watch(self, ranks, runner: ScheduleRunner, rec: Dict[str, Any], t0: float, until: float) -> None:
        """Play the part from ``t0`` (offset 0 of the plan) with live progress until its plan is over
        (offset ``until``), a rank ended, or one hung; every rank's resources sampled meanwhile."""
        from .live import LiveView

        opts = self.opts
        runner.start(t0)
        last_sample = 0.0
        with LiveView(seed=rec.get("seed") or opts.seed, duration=until, live=opts.live, say=self.say) as view:
            while True:
                now = time.time()
                if now - (self.tcp[-1][0] if self.tcp else 0.0) >= 0.5:
                    self.tcp.append([now, ranks.tcp_counters()])
                if now - last_sample >= opts.resource_interval:
                    self._sample(ranks, rec["part"], now)
                    last_sample = now
                with ranks.lock:
                    view.update(now - t0, ranks.states, [f.label for f in runner.active()],
                                len(runner.fault_times()) - len(runner.active()))
                if not runner.running and now >= t0 + until:
                    self._sample(ranks, rec["part"], now)
                    return
                if ranks.dead():
                    return  # a rank ended (an error): the others cannot go on without it
                stuck = [s.rank for s in ranks.states if (s.outstanding(now) or 0.0) > opts.hang_s]
                if stuck:
                    rec["hung_during"] = f"rank(s) {stuck} had a step outstanding for more than {opts.hang_s:.0f} s"
                    return
                time.sleep(0.25)


__all__ = ["ChaosOptions", "run_chaos", "plan", "parts_of", "run_policies", "no_path_deadline", "POLICIES",
           "BOTH_FROM_S"]
