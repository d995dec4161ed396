"""The operators' commands: status, trace analyze, report, cost, simulate."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from ..errors import UsageError


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc))


def _console():
    """A terminal's own width; 200 columns into a pipe or file (rich would wrap at 80)."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=200)


# ------------------------------------------------------------------ status
@click.command()
@click.option("--targets", default=None, help="host:port,... of the ranks' metrics endpoints.")
@click.option("--testbed", "testbed_name", default=None, help="Read the ranks of this testbed (default: le).")
@click.option("--port", type=int, default=None,
              help="Metrics base port of the testbed's ranks (default: $LINKESCAPE_METRICS_PORT, else 9464).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds between scrapes.")
@click.option("--events", "n_events", type=click.IntRange(min=0), default=12, show_default=True,
              help="How many of the last events to show.")
@click.option("--once", is_flag=True, help="Print one view (two scrapes, for the rates) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: the view as JSON.")
def status(targets, testbed_name, port, interval, n_events, once, as_json) -> None:
    """A live view of a running job: every rank x peer x rail, its state and
    bytes/s, the primary rail, and the last events."""
    from .status import Poller, parse_targets, render, targets_of_testbed

    try:
        if targets:
            tlist = parse_targets(targets)
        else:
            base = port if port is not None else int(os.environ.get("LINKESCAPE_METRICS_PORT") or 9464)
            tlist = targets_of_testbed(testbed_name, base)
    except Exception as exc:  # noqa: BLE001 - a missing testbed, a bad target: say so
        _fail(exc)
    poller = Poller(tlist, events=n_events)
    console = _console()
    if once:
        poller.poll()
        time.sleep(interval)
        view = poller.poll()
        if as_json:
            for m in view["ranks"]:
                m["links"] = [{"peer": p, "rail": r, **v} for (p, r), v in sorted(m["links"].items())]
            click.echo(json.dumps(view, indent=1, default=str))
        else:
            console.print(render(view))
        if not view["ranks"]:
            sys.exit(1)
        return
    from rich.live import Live

    with Live(render(poller.poll()), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render(poller.poll()), refresh=True)
        except KeyboardInterrupt:
            pass


# ------------------------------------------------------------------ trace
@click.group()
def trace() -> None:
    """Flight-recorder dumps (LINKESCAPE_TRACE_DIR)."""


@trace.command("analyze")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="The findings as JSON.")
def trace_analyze(paths, as_json) -> None:
    """Name the rank that is behind, and the operation where ranks disagree or wait."""
    from .trace import analyze, format_text, load_dumps

    dumps = load_dumps(paths)
    if not dumps:
        _fail(UsageError(f"no flight-recorder dump in {', '.join(paths)}"))
    results = analyze(dumps)
    click.echo(json.dumps(results, indent=1, default=str) if as_json else format_text(results), nl=not as_json)


# ------------------------------------------------------------------ report
@click.command()
@click.argument("trails", nargs=-1, required=True)
@click.option("--png", "png", default=None, type=click.Path(dir_okay=False), help="Draw the timeline picture here.")
@click.option("--json", "as_json", is_flag=True, help="The rows as JSON.")
def report(trails, png, as_json) -> None:
    """One row per fault in an event trail (LINKESCAPE_EVENTS files): detection,
    failover, rail back and failback times; --png draws the timeline."""
    from .report import build, plot, read_trails, table

    try:
        events = read_trails(trails)
    except UsageError as exc:
        _fail(exc)
    rep = build(events)
    if png:
        rep["png"] = plot(png, rep, events)
    if as_json:
        click.echo(json.dumps(rep, indent=1, default=str))
        return
    _console().print(table(rep))
    if rep["events_by_kind"]:
        click.echo("events: " + ", ".join(f"{k} {v}" for k, v in rep["events_by_kind"].items()))
    if png:
        click.echo(f"timeline: {png}")


# ------------------------------------------------------------------ cost
@click.command()
@click.option("--interruptions", type=click.FloatRange(min=0), default=419, show_default=True,
              help="Unexpected interruptions in the run (Llama 3 405B).")
@click.option("--days", type=click.FloatRange(min=0, min_open=True), default=54, show_default=True,
              help="Length of the run.")
@click.option("--network-share", type=click.FloatRange(0, 1), default=0.084, show_default=True,
              help="Share of the interruptions caused by the network.")
@click.option("--cards", type=click.FloatRange(min=0), default=10000, show_default=True, help="GPUs in the cluster.")
@click.option("--yuan-per-card-hour", type=click.FloatRange(min=0), default=10, show_default=True,
              help="What a GPU costs per hour.")
@click.option("--recovery-hours", type=click.FloatRange(min=0), default=1, show_default=True,
              help="Hours of the whole cluster lost per interruption.")
@click.option("--json", "as_json", is_flag=True, help="network_interruptions, lost_card_hours, lost_yuan, per_year_yuan.")
def cost(interruptions, days, network_share, cards, yuan_per_card_hour, recovery_hours, as_json) -> None:
    """What network interruptions cost: the seed's calculation, every input a flag."""
    from .cost import CostInputs, compute, working

    try:
        res = compute(CostInputs(interruptions, days, network_share, cards, yuan_per_card_hour, recovery_hours))
    except UsageError as exc:
        _fail(exc)
    click.echo(json.dumps(res, indent=1) if as_json else working(res), nl=as_json)


# ------------------------------------------------------------------ simulate
def _sim_options(fn):
    from .simulate import SimParams

    d = SimParams()
    opts = [
        click.option("--gpus", type=click.IntRange(1, 10_000_000), default=d.gpus, show_default=True),
        click.option("--days", type=click.FloatRange(min=0, min_open=True), default=d.days, show_default=True),
        click.option("--gpus-per-host", type=click.IntRange(min=1), default=d.gpus_per_host, show_default=True),
        click.option("--rails", type=click.IntRange(min=1), default=d.rails, show_default=True,
                     help="NICs (each with a cable and two optics) per host."),
        click.option("--nic-rate", type=click.FloatRange(min=0), default=d.nic_per_day, show_default=True,
                     help="Failures per NIC per day (Llama 3: 1.7 %% of 419 in 54 days, 16,384 NICs)."),
        click.option("--cable-rate", type=click.FloatRange(min=0), default=d.cable_per_day, show_default=True,
                     help="Failures per cable per day (half of Llama 3's 8.4 %% 'switch and cable')."),
        click.option("--optic-rate", type=click.FloatRange(min=0), default=d.optic_per_day, show_default=True,
                     help="Failures per optic per day (the other half, two optics per cable)."),
        click.option("--other-rate", type=click.FloatRange(min=0), default=d.other_per_gpu_day, show_default=True,
                     help="Other interruptions per GPU per day (Llama 3's remaining 89.9 %%)."),
        click.option("--whole-host-share", type=click.FloatRange(0, 1), default=d.whole_host_share, show_default=True,
                     help="Share of network faults that take every rail of the host."),
        click.option("--repair-nic-hours", type=click.FloatRange(min=0), default=d.repair_nic_hours, show_default=True),
        click.option("--repair-cable-hours", type=click.FloatRange(min=0), default=d.repair_cable_hours,
                     show_default=True),
        click.option("--repair-optic-hours", type=click.FloatRange(min=0), default=d.repair_optic_hours,
                     show_default=True),
        click.option("--checkpoint-hours", type=click.FloatRange(min=0, min_open=True), default=d.checkpoint_hours,
                     show_default=True, help="Progress between two checkpoints."),
        click.option("--restart-hours", type=click.FloatRange(min=0), default=d.restart_hours, show_default=True,
                     help="From an interruption to training again (detect, reschedule, load)."),
        click.option("--escape-stall-ms", type=click.FloatRange(min=0), default=d.escape_stall_ms, show_default=True,
                     help="Detection + failover of one rail (measured: docs/failover.md)."),
        click.option("--comm-share", type=click.FloatRange(0, 1), default=d.comm_share, show_default=True,
                     help="Share of a step bound by the host's network (it slows while a rail is down)."),
        click.option("--drain/--no-drain", default=d.drain, show_default=True,
                     help="Swap a degraded host at the next checkpoint when running degraded would cost more."),
        click.option("--yuan-per-gpu-hour", type=click.FloatRange(min=0), default=d.yuan_per_gpu_hour,
                     show_default=True),
        click.option("--trials", type=click.IntRange(min=1), default=d.trials, show_default=True),
        click.option("--seed", type=int, default=d.seed, show_default=True),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


@click.command()
@_sim_options
@click.option("--json", "as_json", is_flag=True, help="restart.ettr, escape.ettr and the rest, as JSON.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Draw both against cluster size, 1k to 100k GPUs.")
def simulate(as_json, plot_path, **kw) -> None:
    """Monte Carlo of a training run: restart-from-checkpoint against escape."""
    from . import simulate as sim

    rename = {"nic_rate": "nic_per_day", "cable_rate": "cable_per_day", "optic_rate": "optic_per_day",
              "other_rate": "other_per_gpu_day"}
    try:
        p = sim.SimParams(**{rename.get(k, k): v for k, v in kw.items()})
    except UsageError as exc:
        _fail(exc)
    res = sim.simulate(p)
    if plot_path:
        from dataclasses import replace

        res["plot"] = sim.plot(plot_path, sim.sweep(p), sim.sweep(replace(p, other_per_gpu_day=0.0)), mark=p.gpus)
    if as_json:
        click.echo(json.dumps(res, indent=1))
    else:
        click.echo(sim.format_text(res), nl=False)
        if plot_path:
            click.echo(f"plot: {plot_path}")


__all__ = ["status", "trace", "report", "cost", "simulate"]
