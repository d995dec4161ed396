"""``linkescape bench``: collective benchmarks in the style of nccl-tests."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from typing import Optional

import click

from . import failover

from .spec import DTYPES, OPS, REDOPS, BenchSpec, SpecError, parse_backends, parse_ops, parse_sizes

EPILOG = """\b
Examples:
  linkescape bench all_reduce --sizes 4:256M --world-size 2
  linkescape bench all --sizes 4:64K --backend linkescape,gloo --json out.jsonl
  linkescape bench all_reduce --sizes 16M,64M,256M --world-size 4 --backend linkescape,gloo \\
      --rails 127.0.0.1,127.0.0.2
  linkescape bench --memory all --json memory.jsonl     (RSS with fresh buffers against reused ones)
  linkescape bench all_reduce --sizes 4,1M,64M --world-size 4 --backend linkescape,gloo,mpi --isolated
      (Open MPI over TCP beside them: make mpi; each call timed alone after a barrier)
\b
Sizes follow nccl-tests: the output buffer for all_gather/gather, the input
for reduce_scatter/scatter, the whole buffer otherwise. busbw = algbw x
2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, all_to_all,
gather, scatter), 1 (broadcast, reduce, send_recv). --json writes JSON Lines
(one record per line); `python -m linkescape.bench.report FILE...` gives the
median of several runs.
"""


def _usage(exc: Exception, param: Optional[str] = None) -> click.UsageError:
    if param:
        return click.BadParameter(str(exc), param_hint=param)
    return click.UsageError(str(exc))


def _command_line(spec: BenchSpec, op_text: str, sizes_text: str, factor: float, json_path: Optional[str],
                  launcher: str) -> str:
    args = ["linkescape", "bench", op_text]
    if not all(OPS[o].sizeless for o in spec.ops):
        args += ["--sizes", sizes_text]
    if factor != 2.0 and ":" in sizes_text:
        args += ["--factor", f"{factor:g}"]
    args += ["--world-size", str(spec.world_size), "--backend", ",".join(spec.backends), "--dtype", spec.dtype,
             "--op", spec.redop, "--root", str(spec.root), "--iters", str(spec.iters), "--warmup", str(spec.warmup),
             "--rails", ",".join(spec.rails)]
    if not spec.check:
        args.append("--no-check")
    if spec.isolated:
        args.append("--isolated")
    if json_path:
        args += ["--json", json_path]
    if launcher != "local":
        args += ["--launcher", launcher]
    return " ".join(shlex.quote(a) for a in args)


DEFAULT_RAILS = "127.0.0.1"


@failover.add_failover_options
@click.command("bench", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"],
                                                          "max_content_width": 100})
@click.argument("op", required=False, default="all_reduce", metavar="[OP|all]")
@click.option("-s", "--sizes", default="4:256M", show_default=True,
              help="MIN:MAX (bytes, K/M/G suffixes, multiplied by --factor), or a list 16M,64M,256M")
@click.option("-f", "--factor", type=float, default=2.0, show_default=True, help="size multiplier of a MIN:MAX range")
@click.option("--world-size", type=int, default=2, show_default=True, help="ranks to start on this machine")
@click.option("--backend", "backends", default="linkescape", show_default=True,
              help="linkescape, gloo, mpi (Open MPI over TCP through mpi4py: `make mpi`), floor (the least "
                   "a Python all_reduce costs here: blocking sockets, linkescape's shapes, nothing else; "
                   "all_reduce, barrier, send_recv), or a comma list (linkescape,gloo,mpi,floor): measured "
                   "side by side per size, alternating which goes first")
@click.option("--isolated", is_flag=True,
              help="time each call alone, after a barrier of its backend (as the first gradient bucket of a "
                   "step meets it), instead of back to back")
@click.option("-d", "--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("-o", "--op", "redop", type=click.Choice(REDOPS), default="sum", show_default=True,
              help="reduction operation")
@click.option("-r", "--root", type=int, default=0, show_default=True, help="root of rooted operations")
@click.option("-n", "--iters", type=int, default=20, show_default=True, help="timed iterations per size")
@click.option("-w", "--warmup", type=int, default=5, show_default=True, help="untimed iterations per size")
@click.option("--check/--no-check", default=True, show_default=True,
              help="check the results of the first run of every size (#wrong)")
@click.option("--rails", default=DEFAULT_RAILS, show_default=True, help="linkescape rails: addresses or interfaces")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="write every record here (JSON Lines)")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="seconds one operation may take before its rank gives up")
@click.option("--launcher", type=click.Choice(["local", "env"]), default="local", show_default=True,
              help="local: start --world-size rank processes here; env: this process is one rank of a "
                   "torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
@click.option("--store", "store_kind", type=click.Choice(["auto", "tcp", "file"]), default="auto",
              show_default=True, help="rendezvous store: torch TCPStore, or linkescape.FileStore (no torch)")
@click.option("--faults", default=None, metavar="KINDS",
              help="run the failover benchmark instead: faults of these kinds (cut,blackhole,flap) on a testbed "
                   "(root); --rails is then the testbed's rail count (default 2); see --rate-phases")
@click.option("--scale", "scale", default=None, metavar="N,N,...",
              help="run the scale benchmark instead: for each N, N ranks here with linkescape and gloo side "
                   "by side: idle CPU per rank, 4 B and 1 MiB all_reduce (back to back and isolated, with CPU time "
                   "and context switches per call and rank), init (wall and CPU per rank), store calls a "
                   "second, fds per rank")
@click.option("--idle-seconds", type=float, default=5.0, show_default=True,
              help="--scale: seconds of idleness measured per N")
@click.option("--memory", "memory", default=None, metavar="all|quick|WORD,...",
              help="run the memory benchmark instead: RSS with fresh buffers against reused ones, per case of the "
                   "matrix (all), of the test's subset (quick), or the cases whose names have every WORD "
                   "(e.g. torch,4M or async,stripe); cuts cases need root (a testbed)")
@click.option("--memory-scale", type=float, default=1.0, show_default=True,
              help="--memory: multiply every case's operation count")
@click.option("-v", "--verbose", is_flag=True, help="show the ranks' own output and tracebacks")
def bench(op: str, sizes: str, factor: float, world_size: int, backends: str, dtype: str, redop: str, root: int,
          iters: int, warmup: int, check: bool, isolated: bool, rails: str, json_path: Optional[str], timeout: float,
          launcher: str, store_kind: str, faults: Optional[str], scale: Optional[str], idle_seconds: float,
          memory: Optional[str], memory_scale: float, verbose: bool, **failover_opts) -> None:
    """Benchmark collectives like nccl-tests: OP is all_reduce (default), broadcast, reduce,
    all_gather, reduce_scatter, all_to_all, gather, scatter, send_recv, barrier, a comma list,
    or all."""
    if scale:
        _run_scale(scale, json_path, idle_seconds)
        return
    if memory:
        from ..testbed.netns import sigterm_as_interrupt  # Ctrl-C and SIGTERM take the testbed down

        with sigterm_as_interrupt():
            _run_memory(memory, memory_scale, json_path, world_size)
        return
    if faults:
        # The failover benchmark runs on a testbed of network namespaces.
        from ..testbed.netns import sigterm_as_interrupt
        from .failover import run_failover_cli

        with sigterm_as_interrupt():
            run_failover_cli(faults, rails=rails if rails != DEFAULT_RAILS else 2, json_path=json_path,
                             **failover_opts)
        return
    spec = _spec(op, sizes, factor, world_size, backends, dtype, redop, root, iters, warmup, check, rails, timeout,
                 launcher, store_kind)
    spec.isolated = isolated
    _run(spec, op, sizes, factor, json_path, launcher, verbose)


def _run_scale(scale: str, json_path: Optional[str], idle_seconds: float) -> None:
    try:
        counts = [int(x) for x in scale.split(",") if x.strip()]
    except ValueError:
        raise _usage(ValueError(f"--scale {scale!r}: a comma list of world sizes"), "'--scale'") from None
    if not counts or min(counts) < 2:
        raise _usage(ValueError("--scale: world sizes of 2 or more"), "'--scale'")
    if importlib.util.find_spec("torch") is None:
        raise click.UsageError("--scale compares with gloo, which needs torch (pip install 'linkescape[torch]')")
    from .scale import run_scale

    try:
        run_scale(counts, json_path, echo=click.echo, idle=idle_seconds)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None


def _run_memory(selection: str, scale: float, json_path: Optional[str], world_size: int) -> None:
    from .memory import MemoryBenchError, matrix, quick, run_memory, select

    if scale <= 0:
        raise _usage(ValueError("--memory-scale: a positive factor"), "'--memory-scale'")
    if selection == "all":
        cases = matrix(scale)
    elif selection == "quick":
        cases = quick(0.2 * scale)
    else:
        cases = select(matrix(scale), selection.split(","))
    if not cases:
        raise _usage(ValueError(f"--memory {selection!r}: no case of the matrix has all of these words"),
                     "'--memory'")
    needs = {"torch"} & {c.api for c in cases}
    if needs and importlib.util.find_spec("torch") is None:
        raise click.UsageError("--memory: the torch cases need torch (pip install 'linkescape[torch]')")
    command = " ".join(shlex.quote(a) for a in ["linkescape", "bench", "--memory", selection]
                       + (["--memory-scale", f"{scale:g}"] if scale != 1.0 else [])
                       + (["--world-size", str(world_size)] if world_size != 2 else [])
                       + (["--json", json_path] if json_path else []))
    try:
        records = run_memory(cases, json_path=json_path, echo=click.echo, world=world_size, command=command)
    except MemoryBenchError as exc:
        raise click.ClickException(str(exc)) from None
    grows = [r["case"] for r in records if not r["flat"]]
    if grows:
        raise click.ClickException(f"{len(grows)} case(s) not flat: {', '.join(grows)}")


def _spec(op: str, sizes: str, factor: float, world_size: int, backends: str, dtype: str, redop: str, root: int,
          iters: int, warmup: int, check: bool, rails: str, timeout: float, launcher: str,
          store_kind: str) -> BenchSpec:
    """The run the options ask for, checked (a usage error names the option)."""
    try:
        ops = parse_ops(op)
    except SpecError as exc:
        raise _usage(exc, "OP") from None
    try:
        size_list = parse_sizes(sizes, factor)
    except SpecError as exc:
        raise _usage(exc, "'--sizes' / '--factor'") from None
    try:
        backend_list = parse_backends(backends)
    except SpecError as exc:
        raise _usage(exc, "'--backend'") from None
    rail_list = [r.strip() for r in rails.split(",") if r.strip()]
    have_torch = importlib.util.find_spec("torch") is not None
    if "gloo" in backend_list and not have_torch:
        raise click.UsageError("backend gloo needs torch, which is not installed (pip install 'linkescape[torch]')")
    if "mpi" in backend_list:
        if launcher != "local":
            raise click.UsageError("backend mpi runs its ranks with mpirun on this machine: --launcher local")
        from .mpi import MpiUnavailable, find

        try:
            find()
        except MpiUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    if store_kind == "auto":
        store_kind = "tcp" if have_torch else "file"
    elif store_kind == "tcp" and not have_torch:
        raise click.UsageError("--store tcp needs torch (its TCPStore); use --store file")
    spec = BenchSpec(ops=ops, sizes=size_list, backends=backend_list, world_size=world_size, dtype=dtype,
                     redop=redop, root=root, iters=iters, warmup=warmup, check=check, rails=rail_list,
                     timeout=timeout, store=store_kind)
    if launcher == "env":
        spec.world_size = int(os.environ.get("WORLD_SIZE", world_size) or world_size)
    try:
        spec.validate()
    except SpecError as exc:
        raise _usage(exc) from None
    return spec


def _run(spec: BenchSpec, op: str, sizes: str, factor: float, json_path: Optional[str], launcher: str,
         verbose: bool) -> None:
    """Start the ranks (or be one), print the tables; a wrong element fails the command."""
    from .report import Reporter
    from .runner import BenchError, LocalLauncher, run_env

    if "mpi" in spec.backends:
        from .mpi import MpiLauncher as LocalLauncher  # noqa: F811 - Open MPI's job beside the ranks

    is_rank0 = launcher == "local" or os.environ.get("RANK", "0") == "0"
    command = _command_line(spec, op, sizes, factor, json_path, launcher)
    reporter = Reporter(spec, click.echo if is_rank0 else (lambda _line: None),
                        json_path if is_rank0 else None, command)
    try:
        reporter.header()
        skipped = [o for o in spec.ops if o not in spec.runnable_ops()]
        if skipped:
            click.echo(f"# skipped (need more ranks): {', '.join(skipped)}")
        cpus = os.cpu_count() or 1
        if launcher == "local" and spec.world_size > cpus:
            click.echo(f"# note: {spec.world_size} ranks share {cpus} CPUs")
        try:
            if launcher == "local":
                LocalLauncher(spec, reporter.on_event, verbose=verbose).run()
            else:
                run_env(spec, reporter.on_event)
        except BenchError as exc:
            reporter.close()
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            reporter.close()
            click.echo("linkescape bench: interrupted; every rank stopped", err=True)
            sys.exit(130)
        wrong = reporter.finish() if is_rank0 else 0
    finally:
        reporter.close()
    if wrong:
        raise click.ClickException(f"{wrong} wrong elements (see the #wrong column)")


__all__ = ["bench", "OPS"]
