"""The failover benchmark's command line: the options ``linkescape bench`` takes for it, and its own command.

``linkescape bench --faults KINDS [options]`` (and ``python -m linkescape.bench.failover``)
runs :func:`.bench.run_failover_bench`, or with ``--rate-phases``
:func:`.bench.run_rate_bench`, prints the report and exits non-zero on a
wrong result, an error or a hang.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any, Optional, Sequence, Tuple

from .bench import run_failover_bench, run_rate_bench
from .report import format_report, ok
from .settings import FAULT_KINDS, POLICIES, RATE_FAULT_KINDS, Log


def _click():
    import click

    return click


def add_failover_options(cmd):
    """Add the failover benchmark's options to a click command (``linkescape bench``).

    Adds ``--fault-count``, ``--hosts``, ``--rate``, ``--fault-size``, ``--fault-depth``,
    ``--overhead-repeats``, ``--overhead-seconds``, ``--mptcp/--no-mptcp``,
    ``--mptcp-trials``, ``--mptcp-cc``, ``--congestion``, ``--policy``, ``--rate-phases``,
    ``--phase-seconds``. The rail count comes from
    ``linkescape bench``'s own ``--rails`` (see :func:`rails_count`), and ``--faults``
    and ``--json`` are ``linkescape bench``'s. Pass the parameters on to
    :func:`run_failover_cli`.
    """
    click = _click()
    opts = [
        click.option("--fault-count", type=int, default=20, show_default=True,
                     help="failover bench: faults of each kind"),
        click.option("--hosts", type=int, default=4, show_default=True, help="failover bench: testbed hosts"),
        click.option("--rate", default="1gbit", show_default=True, help="failover bench: tc rate of every rail"),
        click.option("--fault-size", default=None,
                     help="failover bench: bytes per all_reduce (K/M/G suffixes)  [default: 16M; 4M with "
                          "--rate-phases]"),
        click.option("--fault-depth", type=int, default=None,
                     help="failover bench: all_reduces kept in flight  [default: 3; 1 (a plain loop) with "
                          "--rate-phases]"),
        click.option("--overhead-repeats", type=int, default=3, show_default=True,
                     help="failover bench: alternating healthy runs with/without backup rails (0: skip)"),
        click.option("--overhead-seconds", type=float, default=6.0, show_default=True,
                     help="failover bench: seconds per healthy run"),
        click.option("--mptcp/--no-mptcp", default=True, show_default=True,
                     help="failover bench: compare with an MPTCP bulk transfer"),
        click.option("--mptcp-trials", type=int, default=5, show_default=True,
                     help="failover bench: cuts of the MPTCP (and linkescape) 2-host comparison"),
        click.option("--mptcp-cc", default="", help="failover bench: congestion controls of the MPTCP comparison, "
                                                    "e.g. bbr,cubic (default: the namespaces' default)"),
        click.option("--congestion", default="", help="failover bench: TCP congestion control of linkescape "
                                                      "(per socket; default: the namespaces' default)"),
        click.option("--policy", default="", metavar="POLICY[,POLICY]",
                     help="failover bench: LINKESCAPE_POLICY of the ranks, active-backup or stripe (default: the "
                          "library's, active-backup); --rate-phases takes a list and runs each"),
        click.option("--rate-phases", is_flag=True, default=False,
                     help="failover bench: instead of the fault series, measure the job's rate (rank 0's "
                          "all_reduces per second) healthy, during each fault (cut host 1, blackhole host 2, "
                          "flap host 3, rail 0; cross: host 1 rail 0 and host 2 rail 1 at once, relayed) and "
                          "after the repairs, and the longest stall once each fault began"),
        click.option("--phase-seconds", type=float, default=6.0, show_default=True,
                     help="failover bench: length of each rate phase"),
    ]
    for opt in reversed(opts):
        cmd = opt(cmd)
    return cmd


def rails_count(rails: Any, default: int = 2) -> int:
    """``linkescape bench --rails``: a number is the testbed's rail count; anything else
    (the addresses of a normal bench) means the default."""
    try:
        return int(str(rails).strip())
    except (TypeError, ValueError):
        return default


def _size(text: str) -> int:
    from ...common.config import _size as parse_size

    return parse_size(str(text), "--fault-size")


def _kinds(faults: str, rate_phases: bool = False) -> Tuple[str, ...]:
    click = _click()
    allowed = RATE_FAULT_KINDS if rate_phases else FAULT_KINDS
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip())
    bad = [k for k in kinds if k not in allowed]
    if bad or not kinds:
        extra = " (cross only with --rate-phases)" if "cross" in bad else ""
        raise click.BadParameter(f"{faults!r}: expected a comma list of {', '.join(allowed)}{extra}",
                                 param_hint="'--faults'")
    return kinds


def _policies(policy: str) -> Tuple[str, ...]:
    click = _click()
    pols = tuple(p.strip() for p in (policy or "").split(",") if p.strip())
    bad = [p for p in pols if p not in POLICIES]
    if bad:
        raise click.BadParameter(f"{policy!r}: expected {' or '.join(POLICIES)} (or both, comma-separated)",
                                 param_hint="'--policy'")
    return pols


def run_failover_cli(faults: str, rails: Any = 2, json_path: Optional[str] = None, *, fault_count: int = 20,
                     hosts: int = 4, rate: str = "1gbit", fault_size: Any = None, fault_depth: Optional[int] = None,
                     overhead_repeats: int = 3, overhead_seconds: float = 6.0, mptcp: bool = True,
                     mptcp_trials: int = 5, mptcp_cc: str = "", congestion: str = "", policy: str = "",
                     rate_phases: bool = False, phase_seconds: float = 6.0, echo: Optional[Log] = None,
                     **_ignored: Any) -> dict:
    """What ``linkescape bench --faults KINDS ...`` does: run, print the report,
    fail (ClickException) on wrong results, errors or hangs."""
    click = _click()
    echo = echo or click.echo
    kinds = _kinds(faults, rate_phases)
    pols = _policies(policy)
    ccs = tuple(c.strip() for c in mptcp_cc.split(",") if c.strip()) or (None,)
    try:
        if rate_phases:
            result = run_rate_bench(kinds, hosts=hosts, rails=rails_count(rails), rate=rate,
                                    size=_size(fault_size or "4M"), policies=pols or ("active-backup",),
                                    json_path=json_path, log=echo, depth=fault_depth or 1, phase_s=phase_seconds,
                                    congestion=congestion or None)
        else:
            if len(pols) > 1:
                raise click.BadParameter("the fault series runs one policy; --rate-phases runs several",
                                         param_hint="'--policy'")
            result = run_failover_bench(kinds, count=fault_count, hosts=hosts, rails=rails_count(rails), rate=rate,
                                        size=_size(fault_size or "16M"), json_path=json_path, log=echo,
                                        depth=fault_depth or 3, overhead_repeats=overhead_repeats,
                                        overhead_seconds=overhead_seconds, mptcp=mptcp, mptcp_trials=mptcp_trials,
                                        mptcp_congestions=ccs, congestion=congestion or None,
                                        policy=pols[0] if pols else None)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    except click.ClickException:
        raise
    except Exception as exc:  # TestbedError and friends
        if type(exc).__name__.endswith("Error"):
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        raise
    result["command"] = " ".join(shlex.quote(a) for a in sys.argv)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    echo("")
    echo(format_report(result))
    if not ok(result):
        raise click.ClickException("wrong results, errors or hangs during the failover benchmark (see above)")
    return result


def _make_command():
    click = _click()

    @click.command("failover", context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--faults", default="cut,blackhole", show_default=True,
                  help="fault kinds: cut, blackhole, flap (and, with --rate-phases, cross)")
    @click.option("--rails", default="2", show_default=True, help="testbed rails")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                  help="write the whole result (every fault) here")
    @add_failover_options
    def failover(faults: str, rails: str, json_path: Optional[str], **kw: Any) -> None:
        """Failover benchmark on a throwaway testbed (needs root): detection latency,
        time to full throughput, the job's rate, failback, overhead of the backup rails, MPTCP for comparison;
        or (--rate-phases) the job's rate healthy, during each fault and after the repairs."""
        run_failover_cli(faults, rails, json_path, **kw)

    return failover


try:
    failover = _make_command()
except ImportError:  # pragma: no cover - click is a dependency
    failover = None


def main(argv: Optional[Sequence[str]] = None) -> None:
    failover.main(args=list(argv) if argv is not None else None, prog_name="linkescape-failover")


if __name__ == "__main__":
    main()


__all__ = ["add_failover_options", "run_failover_cli", "failover", "rails_count", "main"]
