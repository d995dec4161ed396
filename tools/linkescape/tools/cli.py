"""The operators' commands: status, trace analyze, report, cost, simulate."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from ..common.errors import UsageError


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
    bytes/s, the primary rail, relayed peers ("via R") and the pairs each rank
    relays, and the last events."""
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
    failover, rail back and failback times; one row per relayed pair (via whom,
    for how long); --png draws the timeline."""
    from .report import build, plot, read_trails, relay_table, table

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
    rt = relay_table(rep)
    if rt is not None:
        _console().print(rt)
    if rep["events_by_kind"]:
        click.echo("events: " + ", ".join(f"{k} {v}" for k, v in rep["events_by_kind"].items()))
    if png:
        click.echo(f"timeline: {png}")


# ------------------------------------------------------------------ the cost model (cost, simulate)
_RENAME = {"nic_rate": "nic_per_day", "cable_rate": "cable_per_day", "optic_rate": "optic_per_day",
           "switch_rate": "switch_per_day", "other_rate": "other_per_gpu_day",
           "checkpoint_write_seconds": "checkpoint_write_s", "no_path_seconds": "no_path_s",
           "nccl_detect_seconds": "nccl_detect_s", "ft_stall_seconds": "ft_stall_s", "flap_seconds": "flap_s",
           "reboot_seconds": "reboot_s", "ft_leave_seconds": "ft_leave_s", "ft_rejoin_seconds": "ft_rejoin_s"}


def _model_options(fn):
    """The model's inputs, the same flags on `cost` and `simulate` (docs/operations.md cites each default)."""
    from .model import COVERAGE, POLICIES, SimParams

    d = SimParams()
    F = click.FloatRange
    share = F(0, 1)
    pos = F(min=0)

    def o(*names, **kw):
        kw.setdefault("show_default", True)
        return click.option(*names, **kw)

    opts = [
        o("--gpus", "--cards", "gpus", type=click.IntRange(1, 10_000_000), default=d.gpus,
          help="GPUs in the cluster (Llama 3: 16,384)."),
        o("--days", type=F(min=0, min_open=True), default=d.days, help="Length of the run (Llama 3: 54)."),
        o("--gpus-per-host", type=click.IntRange(min=1), default=d.gpus_per_host),
        o("--rails", type=click.IntRange(min=1), default=d.rails,
          help="NICs per host, each with a cable and two optics (Llama 3: one per GPU)."),
        o("--coverage", type=click.Choice(list(COVERAGE)), default=d.coverage,
          help="Fabric: what a switch or a NIC fault takes (one rail, or every rail of the host)."),
        o("--hosts-per-switch", type=click.IntRange(min=1), default=None, help="Default: the preset's."),
        o("--interruptions", type=pos, default=None,
          help="Unexpected interruptions of this cluster in --days "
               "(default: Llama 3's 419 in 54 days on 16,384 GPUs, scaled)."),
        o("--network-share", type=share, default=d.network_share,
          help="Share 'network switch/cable' (Llama 3: 8.4 %)."),
        o("--nic-share", type=share, default=d.nic_share, help="Share 'network interface card' (Llama 3: 1.7 %)."),
        o("--switch-share", type=share, default=d.switch_share,
          help="Share of 'switch/cable' that is switches (not published: assumed)."),
        o("--nic-rate", type=pos, default=None, help="Failures per NIC per day (default: from the shares)."),
        o("--cable-rate", type=pos, default=None,
          help="Failures per host link (cable) per day (default: from the shares)."),
        o("--optic-rate", type=pos, default=d.optic_per_day,
          help="Failures per optic per day, two per link (default: counted in the cable's)."),
        o("--switch-rate", type=pos, default=None, help="Switch failures per link per day (default: from the shares)."),
        o("--other-rate", type=pos, default=None,
          help="Other interruptions per GPU per day (default: Llama 3's other 89.9 %)."),
        o("--whole-host-share", type=share, default=d.whole_host_share,
          help="Share of the faults that take one rail which take every rail of the host instead (assumed 0: "
               "what takes every rail is the fabric's switch, or a host fault counted in 'other')."),
        o("--repair-nic-hours", type=pos, default=d.repair_nic_hours),
        o("--repair-cable-hours", type=pos, default=d.repair_cable_hours),
        o("--repair-optic-hours", type=pos, default=d.repair_optic_hours),
        o("--repair-switch-hours", type=pos, default=d.repair_switch_hours),
        o("--flap-share", type=share, default=d.flap_share,
          help="Share of the network faults that end by themselves (assumed)."),
        o("--flap-seconds", type=pos, default=d.flap_s, help="Their mean length, exponential (assumed)."),
        o("--reboot-share", type=share, default=d.reboot_share,
          help="Share that a reboot or reload ends (assumed; 17 %% of switch failures were switch-OS bugs, "
               "Singh et al. 2021)."),
        o("--reboot-seconds", type=pos, default=d.reboot_s, help="Their mean length, exponential (assumed)."),
        o("--checkpoint-hours", type=F(min=0, min_open=True), default=None,
          help="Progress between checkpoints (default: Young/Daly, sqrt(2 x write x MTBF))."),
        o("--checkpoint-write-seconds", type=pos, default=d.checkpoint_write_s,
          help="Training stalled per checkpoint."),
        o("--restart-hours", "--recovery-hours", "restart_hours", type=pos, default=d.restart_hours,
          help="From an interruption to training again (detect, reschedule, load)."),
        o("--policy", type=click.Choice(list(POLICIES)), default=d.policy),
        o("--ab-fault-rate", type=F(0, 2, min_open=True), default=d.ab_fault_rate,
          help="active-backup: network rate during a fault / healthy (measured 0.95-1.05)."),
        o("--stripe-fault-rate", type=F(0, 2, min_open=True), default=d.stripe_fault_rate,
          help="stripe: network rate with one rail less / healthy (measured 0.92-0.99)."),
        o("--comm-share", type=share, default=d.comm_share, help="Share of a step bound by the host's network."),
        o("--escape-stall-ms", type=pos, default=d.escape_stall_ms, help="Detection + failover (measured)."),
        o("--no-path-seconds", type=pos, default=d.no_path_s,
          help="How long a job waits with some pair without a path (LINKESCAPE_NO_PATH_TIMEOUT)."),
        o("--relay/--no-relay", default=d.relay, help="Cross faults relayed through a third host (issue 16)."),
        o("--relay-rate", type=F(0, 2, min_open=True), default=d.relay_rate,
          help="Relayed rate / healthy (measured 0.57: docs/failover.md, the relayed phase, lowest of 4 runs)."),
        o("--drain/--no-drain", default=d.drain,
          help="Swap a degraded host at the next checkpoint when running degraded would cost more "
               "(an operator's policy, assumed; it acts only where a fault slows a host)."),
        o("--yuan-per-gpu-hour", "--yuan-per-card-hour", "yuan_per_gpu_hour", type=pos,
          default=d.yuan_per_gpu_hour),
        o("--nccl-detect-seconds", type=pos, default=d.nccl_detect_s, help="NCCL port failover: detection."),
        o("--nccl-ports", type=click.IntRange(min=1), default=d.nccl_ports, help="Ports per NCCL virtual NIC."),
        o("--nccl-merged-share", type=share, default=d.nccl_merged_share, help="Hosts whose ports NCCL merged."),
        o("--ft-replica-groups", type=click.IntRange(min=1), default=None,
          help="torchft FT-HSDP replica groups (default: one per 128 GPUs, Llama 3's model replica: 128 on 16,384)."),
        o("--ft-recover-hours", type=pos, default=None, help="torchft: a group's recovery (default: --restart-hours)."),
        o("--ft-stall-seconds", type=pos, default=d.ft_stall_s,
          help="torchft alone: the whole job's stall for a fault of one rail, which Gloo waits for (torchft's "
               "timeout, 10 s in issue 47's training test; a 4 s cut stalled Gloo 6.7 s there)."),
        o("--ft-leave-seconds", type=pos, default=d.ft_leave_s,
          help="torchft rows: fault to the others' quorum without a host cut off from every link (measured on the "
               "testbed, 4 hosts: tests/torchft/test_torchft_training.py; Gloo's group 1.18 s)."),
        o("--ft-rejoin-seconds", type=pos, default=d.ft_rejoin_s,
          help="torchft rows: a repaired host back in the quorum through torchft's recovery, after its links "
               "return (measured there; a restarted process 3.6-6.7 s)."),
        o("--seed", type=int, default=d.seed),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _params(kw, **extra):
    from .model import SimParams

    try:
        return SimParams(**{_RENAME.get(k, k): v for k, v in kw.items()}, **extra)
    except UsageError as exc:
        _fail(exc)


def _given(name: str) -> bool:
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(name) == ParameterSource.COMMANDLINE


@click.command()
@_model_options
@click.option("--scenario", type=click.Choice(["seed-article"]), default=None,
              help="seed-article: the seed's own arithmetic (3,519,600 yuan) and which of its inputs "
                   "contradict the source.")
@click.option("--break-even", "break_even", is_flag=True,
              help="The no-path wait against a restart: each repair time's verdict, and the savings across waits "
                   "(LINKESCAPE_NO_PATH_TIMEOUT's default is the best at the defaults).")
@click.option("--tornado", "tornado", is_flag=True,
              help="Escape's savings with each assumed input at the low and the high end of its range (what "
                   "`linkescape simulate --plot` draws).")
@click.option("--json", "as_json", is_flag=True, help="Every mode, the savings, the bands, as JSON.")
def cost(scenario, break_even, tornado, as_json, **kw) -> None:
    """What network faults cost a training run and what escape saves: the model in closed form."""
    from .cost import compute, seed_article
    from .modeltext import cost_text, seed_text

    p = _params(kw)
    if break_even:
        from .breakeven import break_even as compute_break_even, break_even_text

        d = compute_break_even(p)
        click.echo(json.dumps(d, indent=1, default=str) if as_json else break_even_text(d), nl=as_json)
        return
    if tornado:
        from .tornado import tornado as compute_tornado, tornado_text

        d = compute_tornado(p)
        click.echo(json.dumps(d, indent=1, default=str) if as_json else tornado_text(d), nl=as_json)
        return
    res = compute(p)
    if scenario == "seed-article":
        names = {"interruptions": "interruptions", "days": "days", "network_share": "network_share",
                 "gpus": "cards", "yuan_per_gpu_hour": "yuan_per_card_hour", "restart_hours": "recovery_hours"}
        seed = seed_article(**{v: kw[k] for k, v in names.items() if _given(k)})
        if as_json:
            click.echo(json.dumps({"scenario": scenario, **seed, "model": res}, indent=1, default=str))
        else:
            click.echo(seed_text(seed, res, p), nl=False)
        return
    click.echo(json.dumps(res, indent=1, default=str) if as_json else cost_text(res, p), nl=as_json)


@click.command()
@_model_options
@click.option("--trials", type=click.IntRange(min=1), default=200, show_default=True,
              help="Monte Carlo runs (paired: every mode on the same faults).")
@click.option("--failure-log", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Replay an operator's faults: CSV with cause, start, repair time, host, rail.")
@click.option("--sweep", "sweep_spec", default=None, metavar="PARAM=a:b[:n]",
              help="The savings across one input (checkpoint-hours, coverage, restart-hours, comm-share, ...).")
@click.option("--json", "as_json", is_flag=True, help="Every mode, the savings and their intervals, as JSON.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Draw a tornado chart: escape's savings across each assumed input's range (with --sweep: "
                   "against the swept input).")
def simulate(trials, failure_log, sweep_spec, as_json, plot_path, **kw) -> None:
    """Monte Carlo of a training run: restart from checkpoint, escape and NCCL's port failover on the same faults."""
    from . import modelplot, sweep
    from .cost import closed_form
    from .failures import fit_to_log, rates_of_log, read_failure_log
    from .modeltext import simulate_text, sweep_text
    from .simulate import simulate as run_simulation

    p = _params(kw, trials=trials)
    faults = info = None
    try:
        if failure_log:
            faults, info = read_failure_log(failure_log)
            p = fit_to_log(p, faults, info, _given("days"))
        spec = sweep.parse(sweep_spec) if sweep_spec else None
    except UsageError as exc:
        _fail(exc)
    if spec:
        rows = sweep.run(p, spec[0], spec[1], faults)
        out = {"inputs": p.as_dict(), "sweep": rows, "log": info}
        if plot_path:
            out["plot"] = modelplot.plot_sweep(plot_path, rows, p)
        click.echo(json.dumps(out, indent=1, default=str) if as_json else sweep_text(rows), nl=as_json)
        if plot_path and not as_json:
            click.echo(f"plot: {plot_path}")
        return
    res = run_simulation(p, faults)
    res["log"] = info
    cf = closed_form(rates_of_log(p, faults) if faults else p)
    res["closed_form"] = {m: cf[m]["ettr"] for m in ("restart", "escape", "nccl", "torchft", "escape_torchft")}
    res["closed_form"]["yuan_saved"] = cf["saved"]["escape"]["yuan_saved"]
    if plot_path:
        from .tornado import tornado

        res["tornado"] = tornado(p)
        sim = None if faults else res["saved"]["escape"]
        res["plot"] = modelplot.plot_tornado(plot_path, res["tornado"], p, sim=sim)
    click.echo(json.dumps(res, indent=1, default=str) if as_json else simulate_text(res, p, cf), nl=as_json)
    if plot_path and not as_json:
        click.echo(f"plot: {plot_path}")


PLOT_SIZES = (1000, 2000, 4000, 8000, 16000, 32000, 64000, 100000)


__all__ = ["status", "trace", "report", "cost", "simulate"]
