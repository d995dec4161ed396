"""``linkescape demo``: train through cable cuts, blackholed optics, flapping links and a cross.

A 4-host x 2-rail testbed (network namespaces, 1 Gbit/s rails) trains a small
model with DDP over the ``linkescape`` backend while rails fail and are
repaired; last, two hosts lose different rails at once (a *cross*: they share
no rail, and a third host relays their traffic for about 10 s). The report
says how many steps were lost (none), how fast every fault was detected and
undone, which pair was relayed through which host and for how long, whether
the result is bit-identical to a fault-free run, and draws the traffic per
rail and the relay over time.

Without root (or without network namespaces) the same training runs on
loopback rails with faults injected inside the processes, and the report
says plainly that they were emulated.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, Optional

import click

from ..common import extras
from .controller import DemoError, DemoOptions, TestbedUnavailable, testbed_unavailable
from .faultplan import CROSS_HOLD, KINDS as FAULT_KINDS
from .model import DEFAULT_SIZE, MODEL_SIZES


def run_demo(opts: DemoOptions, console=None) -> Dict[str, Any]:
    """Run the whole demo; returns the report (also written to ``opts.out``)."""
    extras.require(["torch", "matplotlib"], "demo", "linkescape demo")  # before anything starts
    from rich.console import Console

    from . import controller, report
    from .display import make_display_factory

    console = console or Console()
    if opts.hosts < 2:
        raise DemoError("the demo needs at least 2 hosts")
    if opts.steps < 1:
        raise DemoError("--steps must be at least 1")
    os.makedirs(opts.out, exist_ok=True)
    for stale in ("report.json", "report.md", "timeline.png"):
        try:
            os.unlink(os.path.join(opts.out, stale))
        except FileNotFoundError:
            pass
    started = time.time()
    factory = make_display_factory(opts.quiet, opts.live, console)
    say = (lambda *a, **k: None) if opts.quiet else console.print
    reason = "--emulate was given" if opts.emulate else testbed_unavailable()
    info = runs = None
    if reason is None:
        try:
            info, runs = controller.testbed_runs(opts, factory)
        except TestbedUnavailable as exc:
            reason = str(exc)
    if info is None:
        say(f"[bold yellow]No testbed ({reason}): running on loopback rails with EMULATED faults "
            f"(injected inside the processes).[/]", highlight=False, soft_wrap=True)
        info, runs = controller.emulated_runs(opts, factory, reason)
    rep = report.build_report(opts, info, runs, started)
    faulty = next((r for r in runs if r.name == "faulty"), None)
    png = os.path.join(opts.out, "timeline.png")
    if faulty is not None:
        try:
            report.plot_timeline(png, rep, faulty)
            rep["timeline_png"] = os.path.abspath(png)
        except Exception as exc:  # noqa: BLE001 - the report is still worth writing
            rep["timeline_png"] = None
            rep["issues"].append(f"timeline picture failed: {type(exc).__name__}: {exc}")
    _save_samples(faulty, opts.out)
    rep["runtime_s"] = round(time.time() - started, 1)
    jpath, mpath = report.write_report(rep, opts.out)
    rep["report_json"], rep["report_md"] = os.path.abspath(jpath), os.path.abspath(mpath)
    return rep


def _save_samples(run, out: str) -> None:
    """The raw NIC counter samples of the faulty run (``tx_samples.jsonl``)."""
    if run is None or not run.samples:
        return
    from ..common import jsonl

    with open(os.path.join(out, "tx_samples.jsonl"), "w") as f:
        for t, vals in run.samples:
            f.write(jsonl.encode({"t": t, "tx_bytes": vals}))


def _print_summary(rep: Dict[str, Any], console, quiet: bool) -> None:
    from .report import to_markdown

    md = to_markdown(rep)
    if quiet:
        from ..tools.timeline import NOT_SEEN, format_ms

        bi = rep.get("bit_identical")
        lines = [("EMULATED faults (no testbed). " if rep.get("emulated") else "") + f"steps lost: {rep['steps_lost']}",
                 "bit-identical to the fault-free run: " + ("skipped" if bi is None else "yes" if bi else "NO")]
        for f in rep.get("faults", []):
            if f["kind"] == "cross":
                lines.append(f"{f['label']}: detected after {format_ms(f['detection_ms'], NOT_SEEN)}, relayed "
                             f"after {format_ms(f.get('relay_ms'), NOT_SEEN)} via "
                             f"{', '.join(f'host {v}' for v in f.get('via') or []) or '-'} for "
                             f"{format_ms(f.get('relayed_ms'), NOT_SEEN)}, direct again "
                             f"{format_ms(f['recovery_ms'], NOT_SEEN)} after the repair")
                continue
            lines.append(f"{f['label']}: detected after {format_ms(f['detection_ms'], NOT_SEEN)}, "
                         f"back on rail 0 {format_ms(f['recovery_ms'], NOT_SEEN)} after the repair")
        lines += [f"issue: {i}" for i in rep.get("issues", [])]
        lines.append(f"report: {rep['report_md']}")
        console.print("\n".join(lines), highlight=False, markup=False)
        return
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(md))
    else:
        console.print(md, highlight=False, markup=False, soft_wrap=True)
    console.print(f"report: {rep['report_md']} (and report.json); timeline: {rep.get('timeline_png')}",
                  highlight=False, markup=False, soft_wrap=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out", default="./linkescape-demo", show_default=True, type=click.Path(file_okay=False),
              help="Directory for report.md, report.json, timeline.png and the runs' files.")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(1, 100000), help="Training steps.")
@click.option("--hosts", default=4, show_default=True, type=click.IntRange(2, 64), help="Hosts (one rank each).")
@click.option("--rails", default=2, show_default=True, type=click.IntRange(2, 16), help="Rails per host.")
@click.option("--rate", default="1gbit", show_default=True, help="Rail speed (tc rate) on the testbed.")
@click.option("--model-size", type=click.Choice(sorted(MODEL_SIZES)), default=DEFAULT_SIZE, show_default=True,
              help="Size of the MLP (small: quick runs, tests).")
@click.option("--seed", default=1234, show_default=True, type=int, help="Seed of the weights and the data.")
@click.option("--emulate", is_flag=True, help="Loopback rails and in-process faults even when root.")
@click.option("--no-reference", is_flag=True, help="Skip the fault-free comparison run.")
@click.option("--quiet", "-q", is_flag=True, help="No live display; print only the summary.")
@click.option("--live/--plain", "live", default=None,
              help="Force the rich live display, or plain lines (default: live on a terminal).")
@click.option("--faults", "fault_kinds", default=",".join(FAULT_KINDS), show_default=True, metavar="KINDS",
              help="The faults of the faulty run, played in this order (cross last): cut, blackhole, flap, cross.")
@click.option("--cross-hold", type=click.FloatRange(min=1.0), default=CROSS_HOLD, show_default=True,
              metavar="SECONDS", help="How long the cross lasts (two hosts without a rail in common, relayed).")
@click.option("--torchft", "torchft", is_flag=True,
              help="Instead: torchft training (4 replica groups) through a cut, a blackhole, a flap and a lost "
                   "host, linkescape's group beside torchft's Gloo group (needs root and "
                   "pip install 'linkescape[torchft]'; about 5 minutes; --out and --quiet apply).")
def demo(out: str, steps: int, hosts: int, rails: int, rate: str, model_size: str, seed: int, emulate: bool,
         no_reference: bool, quiet: bool, live: Optional[bool], fault_kinds: str, cross_hold: float,
         torchft: bool) -> None:
    """Train through cable cuts, blackholed optics, flapping links and a cross.

    Builds a testbed (HOSTS network namespaces x RAILS rails at RATE; needs
    root), trains an MLP with DDP over the linkescape backend, one rank per
    host, while a cable is cut, an optic blackholed and a link flapped, then
    hosts 1 and 2 lose different rails at once (a cross: a third host relays
    their traffic), then trains again without faults and compares bit for
    bit. The report says how many steps were lost, how fast each fault was
    detected and repaired, which pair was relayed through which host and for
    how long, and where the traffic went (timeline.png). Without root it runs
    on loopback rails with emulated faults and says so.
    """
    from rich.console import Console

    if torchft:
        _torchft_demo(out, quiet, Console())
        return
    kinds = tuple(k.strip() for k in fault_kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad or not kinds or len(set(kinds)) != len(kinds):
        raise click.BadParameter(f"{fault_kinds!r}: expected some of {', '.join(FAULT_KINDS)}, each once",
                                 param_hint="'--faults'")
    kinds = tuple(k for k in FAULT_KINDS if k in kinds)  # played in their order, the cross last
    console = Console()
    opts = DemoOptions(out=out, steps=steps, hosts=hosts, rails=rails, rate=rate, emulate=emulate,
                       reference=not no_reference, quiet=quiet, model_size=model_size, seed=seed, live=live,
                       faults=kinds, cross_hold=cross_hold)
    from ..testbed.netns import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            rep = run_demo(opts, console)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: the testbed and the training processes were torn down")
        sys.exit(130)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    _print_summary(rep, console, quiet)
    ok = rep["steps_lost"] == 0 and rep.get("training_ok") and rep.get("bit_identical") is not False
    sys.exit(0 if ok else 1)


def _torchft_demo(out: str, quiet: bool, console) -> None:
    """``linkescape demo --torchft`` (:mod:`linkescape.torchft.demo`)."""
    extras.require(["torch", "torchft", "matplotlib"], "torchft", "linkescape demo --torchft")
    from ..testbed.netns import sigterm_as_interrupt
    from ..torchft.demo import main_cli

    try:
        with sigterm_as_interrupt():
            status = main_cli(out if out != "./linkescape-demo" else "./linkescape-demo-torchft", quiet, console)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: the testbed and the training processes were torn down")
        sys.exit(130)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(status)


__all__ = ["demo", "run_demo", "DemoOptions", "DemoError"]
