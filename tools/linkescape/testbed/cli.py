"""``linkescape testbed ...`` and ``linkescape fault ...`` commands.

Fault commands print one JSON line per applied change, e.g.
``{"ts": 1718000000.123, "fault": "cut", "host": 0, "rail": 1}``, where ``ts``
is the wall time from which the fault is in effect, so a benchmark can measure
detection latency from it.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from typing import Any, Callable, Optional, Sequence

import click

from . import faults
from .netns import DEFAULT_NAME, Testbed, TestbedError, down as _down, require_root, state_path


def _errors(fn: Callable) -> Callable:
    """Turn testbed errors into a clean ``Error: ...`` and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TestbedError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


class RailType(click.ParamType):
    """A rail index, or ``mgmt`` for the management NIC."""

    name = "RAIL"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, int) or value == "mgmt":
            return value
        if str(value).lower() in ("m", "mgmt"):
            return "mgmt"
        try:
            return int(str(value).lstrip("r"))
        except ValueError:
            self.fail(f"{value!r} is not a rail number (0, 1, r1 ...) or 'mgmt'", param, ctx)


_name = click.option("--name", "-n", default=DEFAULT_NAME, show_default=True,
                     help="Testbed name: prefix of its namespaces, bridges and veths.")
_host = click.option("--host", "host", type=click.IntRange(min=0), required=True, help="Host index.")
_rail = click.option("--rail", "rail", type=RailType(), required=True, help="Rail index, or 'mgmt'.")


def _emit(event: Any) -> None:
    click.echo(event.to_json())
    sys.stdout.flush()


# ====================================================================== testbed
@click.group("testbed")
def testbed() -> None:
    """Build, inspect and use a multi-host, multi-rail testbed of network namespaces."""


@testbed.command("up")
@click.option("--hosts", type=click.IntRange(1, 254), default=2, show_default=True, help="Number of hosts.")
@click.option("--rails", type=click.IntRange(1, 256), default=2, show_default=True, help="NICs (rails) per host.")
@click.option("--rate", default=None, help="Shape every rail NIC with tbf at this tc rate, e.g. 1gbit.")
@click.option("--replace", is_flag=True, help="Tear down an existing testbed of this name first.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@_name
@_errors
def up_cmd(hosts: int, rails: int, rate: Optional[str], replace: bool, as_json: bool, name: str) -> None:
    """Create hosts NAME-h0.., rail bridges NAME-b0.. and the mgmt bridge NAME-bm.

    Rail r of host i is NIC rR with 198.18.r.(i+1)/24; NIC mgmt has
    198.19.0.(i+1)/24.
    """
    tb = Testbed.up(hosts, rails, rate=rate, name=name, replace=replace)
    if as_json:
        click.echo(json.dumps(tb.status(), indent=2))
        return
    click.echo(f"testbed {tb.name}: {tb.hosts} hosts x {tb.rails} rails"
               f"{f', rails shaped to {rate}' if rate else ''}; state in {tb.state_file}")
    for i in range(tb.hosts):
        addrs = " ".join(f"{tb.nic(r)}={tb.host_addr(i, r)}" for r in range(tb.rails))
        click.echo(f"  host {i}: netns {tb.netns(i)}  {addrs}  mgmt={tb.mgmt_addr(i)}")


@testbed.command("down")
@_name
@_errors
def down_cmd(name: str) -> None:
    """Remove every namespace, bridge and veth of the testbed (idempotent)."""
    removed = _down(name)
    if not removed:
        click.echo(f"testbed {name}: nothing to remove")
        return
    parts = [f"{len(v)} {k}" for k, v in removed.items() if k != "state"]
    click.echo(f"testbed {name}: removed {', '.join(parts) or 'state file'}")


@testbed.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_name
@_errors
def status_cmd(as_json: bool, name: str) -> None:
    """Show hosts, rails and the link state of every NIC."""
    require_root()
    tb = Testbed.attach(name)
    st = tb.status()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"testbed {tb.name}: {tb.hosts} hosts x {tb.rails} rails, rate {tb.rate or 'unshaped'}, "
               f"state file {state_path(tb.name)}")
    for h in st["host_status"]:
        click.echo(f"  host {h['host']} ({h['netns']}{'' if h['present'] else ', MISSING'})")
        for nic in h["nics"]:
            flags = [w for w, on in (("CUT", nic["cut"]), ("BLACKHOLE", nic["blackholed"])) if on]
            if nic.get("lossy") is not None:
                flags.append(f"LOSSY {nic['lossy']:g}%")
            link = "up" if nic["admin_up"] and nic["carrier"] else ("no-carrier" if nic["admin_up"] else "down")
            click.echo(f"    {nic['nic']:<5} {nic['addr']:<15} {link:<10} {' '.join(flags)}")


@testbed.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_host
@_name
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_errors
def run_cmd(host: int, name: str, command: Sequence[str]) -> None:
    """Run COMMAND inside host I (after --); its exit status is passed through."""
    require_root()
    tb = Testbed.attach(name)
    try:
        rc = tb.exec(host, list(command)).returncode
    except KeyboardInterrupt:
        rc = 130
    sys.exit(128 - rc if rc < 0 else rc)


@testbed.command("launch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--hosts", type=click.IntRange(min=1), default=None, help="Use hosts 0..N-1 (default: all).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--master-port", type=click.IntRange(1, 65535), default=29500, show_default=True)
@click.option("--torchrun", default=None, help="torchrun command (default: the one next to this python).")
@click.option("--timeout", type=float, default=None, help="Kill the job after this many seconds (status 124).")
@click.option("--grace", type=float, default=30.0, show_default=True,
              help="After one host fails, seconds before the others are terminated.")
@click.option("--no-prefix", is_flag=True, help="Do not tag output lines with [hI].")
@_name
@click.argument("script", nargs=-1, required=True, type=click.UNPROCESSED)
@_errors
def launch_cmd(hosts: Optional[int], nproc_per_node: int, master_port: int, torchrun: Optional[str],
               timeout: Optional[float], grace: float, no_prefix: bool, name: str, script: Sequence[str]) -> None:
    """Run SCRIPT ARGS with one torchrun per host; rendezvous over mgmt (198.19.0.1).

    Every host gets LINKESCAPE_RAILS=r0,r1,... Exits with the worst status.
    """
    from .launch import launch

    require_root()
    tb = Testbed.attach(name)
    rc = launch(tb, list(script), hosts=hosts, nproc_per_node=nproc_per_node, master_port=master_port,
                torchrun=torchrun.split() if torchrun else None, prefix_output=not no_prefix,
                timeout=timeout, grace=grace)
    sys.exit(rc)


# ======================================================================== fault
@click.group("fault")
def fault() -> None:
    """Inject link faults into a testbed; each prints {"ts": ..., "fault": ...} per change.

    cut, blackhole, lossy, flap; repair (one kind) and restore (all).
    """


def _fault_command(kind: str, doc: str, *options: Callable) -> None:
    """``fault KIND --host I --rail R [OPTIONS]``: one call of :func:`linkescape.testbed.faults.KIND`."""
    def cmd(host: int, rail: Any, name: str, **extra: Any) -> None:
        require_root("fault injection")
        _emit(getattr(faults, kind)(Testbed.attach(name), host, rail, **extra))

    for decorator in reversed((fault.command(kind, help=doc), _host, _rail, *options, _name, _errors)):
        cmd = decorator(cmd)


_fault_command("cut", "Take the bridge-side veth down: the host's NIC loses carrier.")
_fault_command("blackhole", "Drop all traffic in and out of the NIC (nftables); carrier stays up.")
_fault_command("restore", "Undo every fault (cut, blackhole, lossy) on the NIC (idempotent).")
_fault_command("lossy", "Drop a share of the NIC's packets at random; carrier stays up (a grey failure).",
               click.option("--loss", type=click.FloatRange(0.01, 100.0), default=5.0, show_default=True,
                            help="Percent of packets dropped at random, each way (nftables numgen random)."))
_fault_command("repair", "Undo one kind of fault on the NIC and leave the others.",
               click.option("--kind", type=click.Choice(["cut", "blackhole", "lossy"]), required=True,
                            help="The one kind of fault to undo; the others stay."))


@fault.command("flap")
@_host
@_rail
@click.option("--period", type=click.FloatRange(min=0, min_open=True), required=True,
              help="Seconds per down+up cycle (down half, up half).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Number of cycles.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Keep flapping for this many seconds.")
@click.option("--mode", type=click.Choice(["cut", "blackhole"]), default="cut", show_default=True,
              help="How the link goes down.")
@_name
@_errors
def flap_cmd(host: int, rail: Any, period: float, count: Optional[int], duration: Optional[float], mode: str,
             name: str) -> None:
    """Flap a link down and up; without --count/--duration until SIGINT/SIGTERM. Ends up."""
    require_root("fault injection")
    tb = Testbed.attach(name)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()  # flap() notices within its wait and restores the link

    old = {}
    if threading.current_thread() is threading.main_thread():  # signal() only works there
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        faults.flap(tb, host, rail, period, count=count, duration=duration, mode=mode, stop=stop,
                    on_event=_emit)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":  # pragma: no cover - `python -m linkescape.testbed.cli testbed up`
    _main = click.Group(commands=[testbed, fault])
    _main()
