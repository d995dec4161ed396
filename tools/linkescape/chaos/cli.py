"""``linkescape chaos``: the soak of random overlapping faults under a verified workload."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from typing import Any, Optional

import click

from ..faults import KINDS, Schedule, ScheduleError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "": 1.0}


def parse_duration(text: str) -> float:
    """``90``, ``60s``, ``10m``, ``1.5h``, ``500ms`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|min|m|h|)\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"duration {text!r}: expected e.g. 60s, 10m, 1h or 500ms")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]+)\s*([kmg]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ValueError(f"size {text!r}: expected e.g. 4M, 256K or 4096")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2)]


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _kinds(text: str):
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise click.BadParameter(f"unknown fault kinds {bad}; choose from {', '.join(KINDS)}")
    return kinds


def _hold(text: str):
    """``MIN:MAX`` durations -> (min, max) seconds."""
    a, sep, b = text.partition(":")
    if not sep:
        raise ValueError(f"--hold wants MIN:MAX (e.g. 0.5s:4s), not {text!r}")
    lo, hi = parse_duration(a), parse_duration(b)
    if not 0 < lo <= hi:
        raise ValueError(f"--hold: need 0 < MIN <= MAX, got {text!r}")
    return (lo, hi)


def _cross_hold(text: Optional[str]):
    """``20s`` (every cross lasts that long) or ``MIN:MAX`` -> (min, max) seconds, or None."""
    if not text:
        return None
    a, sep, b = text.partition(":")
    lo = parse_duration(a)
    hi = parse_duration(b) if sep else lo
    if not 0 < lo <= hi:
        raise ValueError(f"--cross-hold: need 0 < MIN <= MAX, got {text!r}")
    return (lo, hi)


@click.command("chaos")
@click.option("--hosts", type=click.IntRange(2, 15), default=4, show_default=True, help="Testbed hosts (one rank each).")
@click.option("--rails", type=click.IntRange(1, 16), default=2, show_default=True, help="Rails (NICs) per host.")
@click.option("--rate", default="1gbit", show_default=True, help="tc rate of every rail NIC ('none': unshaped).")
@click.option("--duration", type=Duration(), default="10m", show_default=True,
              help="How long faults come (60s, 10m, ...); every fault is repaired 3 s before the end.")
@click.option("--seed", type=int, default=None, help="Seed of the schedule and the workload (default: random, printed).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory, new or empty (default /tmp/linkescape-chaos-sSEED-TIME); kept after the run.")
@click.option("--kinds", default=",".join(KINDS), show_default=True, help="Fault kinds to draw from.")
@click.option("--interval", type=Duration(), default="1s", show_default=True, help="Mean time between fault starts.")
@click.option("--isolate-bound", type=Duration(), default="3s", show_default=True,
              help="isolate and cross last less than this.")
@click.option("--max-active", type=click.IntRange(min=1), default=3, show_default=True,
              help="At most this many faults at once.")
@click.option("--hold", "hold_text", default="0.5s:4s", show_default=True, metavar="MIN:MAX",
              help="How long a cut, blackhole or lossy fault lasts (uniform between the two).")
@click.option("--schedule", "schedule_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Replay this schedule (a schedule.json of an earlier run, or a scripted one).")
@click.option("--window", default=None, metavar="FROM:TO",
              help="Only the faults that start in this stretch of the schedule (seconds), shifted to 0.")
@click.option("--schedule-only", is_flag=True, help="Print the schedule (and --json it) and exit; needs no root.")
@click.option("--max-bytes", default="4M", show_default=True, help="Largest buffer of the workload.")
@click.option("--hang", "hang_s", type=Duration(), default="60s", show_default=True,
              help="A step outstanding this long is a hang.")
@click.option("--op-timeout", type=Duration(), default="60s", show_default=True,
              help="LINKESCAPE_TIMEOUT of the ranks.")
@click.option("--live/--no-live", default=None, help="Rich live panel (default: when stdout is a terminal).")
@click.option("--reanalyze", type=click.Path(exists=True, file_okay=False), default=None, metavar="RUN_DIR",
              help="Report again on an earlier run's directory (no testbed, no root).")
@click.option("--cross-hold", "cross_hold_text", default=None, metavar="DURATION|MIN:MAX",
              help="Cross faults last this long (or between MIN and MAX) instead of less than --isolate-bound: "
                   "longer than the ranks' no-path deadline, so only a relay lets their pair go on.")
@click.option("--no-path-timeout", type=Duration(), default=None,
              help="LINKESCAPE_NO_PATH_TIMEOUT of the ranks (default with --cross-hold: the plan's longest stretch "
                   "in which a pair has neither a path nor a relay, or --isolate-bound, + 5 s; else the library's).")
@click.option("--policy", type=click.Choice(["auto", "active-backup", "stripe", "both"]), default="auto",
              show_default=True,
              help="LINKESCAPE_POLICY of the ranks; both: the first half under active-backup, the second under "
                   "stripe (new ranks, same testbed); auto: both from --duration 10m on, else the library's default.")
@click.option("--resource-interval", type=Duration(), default="5s", show_default=True,
              help="How often every rank's RSS, fds and threads are sampled.")
def chaos(hosts: int, rails: int, rate: str, duration: float, seed: Optional[int], json_path: Optional[str],
          out: Optional[str], kinds: str, interval: float, isolate_bound: float, max_active: int, hold_text: str,
          schedule_path: Optional[str], window: Optional[str], schedule_only: bool, max_bytes: str, hang_s: float,
          op_timeout: float, live: Optional[bool], reanalyze: Optional[str], cross_hold_text: Optional[str],
          no_path_timeout: Optional[float], policy: str, resource_interval: float) -> None:
    """Soak the escape on a testbed: random overlapping faults under every operation, checked exactly.

    Faults: cut, blackhole, flap, isolate (every rail of one host, shorter than
    --isolate-bound), cross (two hosts lose different rails: no common path,
    a third host relays; --cross-hold makes them outlast the no-path deadline),
    lossy (1-20 % of packets dropped, carrier up). The seed reproduces the
    schedule and the workload. Every rank's RSS, fds and threads are sampled
    over the run (rss.png). Exits 1 on any wrong result, error, hang, a stall
    beyond its bound, or (parts of 10 min or more) a rank whose RSS, fds or
    threads grow (see the report's definitions).
    """
    from .controller import ChaosOptions, no_path_deadline, parts_of, plan, run_chaos
    from .report import build_report, format_report, load_run

    if reanalyze:
        rep = build_report(*load_run(reanalyze))
        click.echo(format_report(rep))
        if json_path:
            with open(json_path, "w") as fh:
                json.dump(rep, fh, indent=1, default=str)
        sys.exit(rep["exit_code"])
    seed_given = seed is not None
    if seed is None:
        seed = secrets.randbelow(1 << 31)
    try:
        opts = ChaosOptions(hosts=hosts, rails=rails, rate=None if rate.lower() == "none" else rate,
                            duration=duration, seed=seed, json_path=json_path, out=out, kinds=_kinds(kinds),
                            interval=interval, isolate_bound=isolate_bound, max_active=max_active,
                            hold=_hold(hold_text), max_bytes=parse_size(max_bytes), op_timeout=op_timeout,
                            hang_s=hang_s, live=live, policy=policy, cross_hold=_cross_hold(cross_hold_text),
                            no_path_timeout=no_path_timeout, resource_interval=resource_interval,
                            command=" ".join(["linkescape", "chaos", *sys.argv[2:]]) if len(sys.argv) > 1 else None)
        if schedule_path:
            opts.schedule = Schedule.load(schedule_path)
            if opts.schedule.seed is not None and not seed_given:
                opts.seed = int(opts.schedule.seed)  # the workload of the run it came from
        sched = plan(opts)
        if window:
            a, _, b = window.partition(":")
            sched = sched.window(float(a or 0), float(b or sched.duration))
            opts.schedule = sched
        if "cross" in opts.kinds and (hosts < 2 or rails < 2) and not schedule_path:
            raise ScheduleError("cross needs 2 hosts and 2 rails; pass --kinds without it")
        parts = parts_of(opts, sched)
        deadline, longest = no_path_deadline(opts, sched)
    except (ScheduleError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if schedule_only:
        click.echo(f"seed {sched.seed}: {len(sched.faults)} faults over {sched.duration:.0f} s ("
                   + ", ".join(f"{k} {v}" for k, v in sched.counts().items()) + ")")
        if len(parts) > 1:
            click.echo("parts: " + "; ".join(f"{p.get('policy') or 'default'} from {p['from']:g} s to {p['to']:g} s "
                                              f"(seed {p.get('seed')})" for p in parts))
        if deadline is not None:
            crosses = [f for f in sched.faults if f.kind == "cross"]
            click.echo(f"no-path deadline {deadline:g} s: {sum(1 for f in crosses if f.hold > deadline)} of "
                       f"{len(crosses)} cross faults last longer; longest stretch with neither a path nor a relay "
                       f"for some pair: {longest:.1f} s")
        for f in sched.faults:
            click.echo(f"  {f.label}")
        if json_path:
            with open(json_path, "w") as fh:
                fh.write(sched.to_json() + "\n")
        return
    left = _earlier_run(out)
    if left:
        # a run appends to its trails (ops, events) and finds its job's store and stop file there: a
        # second run in the same directory read the first one's store (handshakes with its secret
        # failed at set-up) and mixed both runs' operations in its report
        raise click.UsageError(f"--out {out} holds an earlier run ({', '.join(left)}): remove it or pick "
                               f"another directory")
    from ..testbed.netns import TestbedError, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():  # kill (SIGTERM) stops the ranks and takes the testbed down, as Ctrl-C does
            rep = run_chaos(opts, say=click.echo)
    except (TestbedError, ScheduleError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_report(rep))
    if json_path:
        click.echo(f"report: {json_path}")
    sys.exit(rep["exit_code"])


def _earlier_run(out: Optional[str]) -> list:
    """What an earlier run left in the run directory ``out`` (nothing when it is new or empty)."""
    if not out or not os.path.isdir(out):
        return []
    return [name for name in ("run.json", "store", "ops-0.jsonl", "part-1") if os.path.exists(os.path.join(out, name))]


__all__ = ["chaos", "parse_duration"]

if __name__ == "__main__":  # pragma: no cover
    chaos()  # pylint: disable=no-value-for-parameter
