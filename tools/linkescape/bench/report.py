"""Output of a benchmark: the nccl-tests style table, the JSON records, the summary.

Also ``python -m linkescape.bench.report RUN.jsonl...``: the median over
several runs (records from ``linkescape bench --json``), as a text or
Markdown table with the linkescape/gloo ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import statistics
import sys
from collections import OrderedDict, defaultdict
from typing import Callable, Dict, Iterable, List, Optional, TextIO

from ..common import jsonl
from .spec import OPS, BenchSpec, format_size, tcp_congestion_control

COLS = "#       size         count      type"
GROUP = "     time   algbw   busbw  #wrong"
UNITS0 = "#        (B)    (elements)          "
UNITS = "      (us)  (GB/s)  (GB/s)        "
RATIO_COLS = "    busbw     time"
RATIO_UNITS = "  (ratio)  (ratio)"


def fmt_time(us: float) -> str:
    if us >= 10000:
        return f"{us:8.0f}"
    if us >= 100:
        return f"{us:8.1f}"
    return f"{us:8.2f}"


def fmt_bw(gbs: float) -> str:
    return f"{gbs:6.2f}"


def fmt_wrong(wrong: Optional[int]) -> str:
    return f"{'N/A' if wrong is None else wrong:>6}"


def ratios(recs: Dict[str, dict], other: str = "gloo") -> Optional[tuple]:
    """(busbw ratio, time ratio) linkescape/``other``, None when not both."""
    le, gl = recs.get("linkescape"), recs.get(other)
    if not le or not gl:
        return None
    bw = le["busbw"] / gl["busbw"] if gl["busbw"] > 0 and le["busbw"] > 0 else None
    t = le["time_us"] / gl["time_us"] if gl["time_us"] > 0 else None
    return bw, t


def _r(x: Optional[float]) -> str:
    return f"{'-':>7}" if x is None else f"{x:7.2f}"


#: the backends linkescape is compared with, in their column order
OTHERS = ("gloo", "mpi", "floor")
#: a record's per call costs of a rank (runner.make_record, usage.py)
USAGE = ("cpu_us", "vcsw", "ivcsw")


def geomean(xs: List[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


class Reporter:
    """Turns rank 0's events into the printed table and the JSON records."""

    def __init__(self, spec: BenchSpec, write: Callable[[str], None], json_path: Optional[str] = None,
                 command: Optional[str] = None) -> None:
        self.spec = spec
        self.write = write
        self.json_path = json_path
        self.command = command
        self.both = len(spec.backends) > 1
        #: the ratio columns: linkescape against each other backend
        self.others = [b for b in spec.backends if b != "linkescape"] if "linkescape" in spec.backends else []
        self.rows: Dict[str, List[Dict[str, dict]]] = OrderedDict()
        self.records: List[dict] = []
        self._json: Optional[TextIO] = None
        self.started = datetime.datetime.now().astimezone()
        if json_path:
            self._json = open(json_path, "w")

    # ------------------------------------------------------------------ header
    def header(self) -> None:
        s = self.spec
        w = self.write
        w(f"# linkescape bench: {self.command or 'linkescape bench'}")
        w(f"# date: {self.started.isoformat(timespec='seconds')}  host: {socket.gethostname()}  "
          f"kernel: {platform.release()}  cpus: {os.cpu_count()}")
        try:
            load = "  loadavg: " + " ".join(f"{x:.2f}" for x in os.getloadavg())
        except OSError:
            load = ""
        w(f"# tcp_congestion_control: {tcp_congestion_control() or 'unknown'}  "
          f"GLOO_SOCKET_IFNAME: {os.environ.get('GLOO_SOCKET_IFNAME', 'lo')}{load}")
        sizes = s.sizes
        w(f"# world_size: {s.world_size}  rails: {','.join(s.rails)}  backends: {','.join(s.backends)}"
          + ("  (alternating order per size)" if self.both else ""))
        sized = "" if all(OPS[o].sizeless for o in s.ops) else \
            f"  sizes: {format_size(min(sizes))}..{format_size(max(sizes))} ({len(sizes)} sizes)"
        w(f"# ops: {','.join(s.ops)}{sized}  dtype: {s.dtype}  redop: {s.redop}  root: {s.root}")
        w(f"# warmup: {s.warmup}  iters: {s.iters}  validation: {'first run' if s.check else 'off'}  "
          f"timeout: {s.timeout:g}s  time: median over iterations of the slowest rank"
          + ("  (isolated: each call after a barrier)" if s.isolated else "  (back to back)"))
        try:
            from importlib.metadata import version

            lib = f"linkescape {version('linkescape')}"
        except Exception:  # noqa: BLE001
            lib = "linkescape"
        extra = ""
        if "gloo" in s.backends:
            try:
                from importlib.metadata import version

                extra = f"  torch {version('torch')}"
            except Exception:  # noqa: BLE001
                pass
        w(f"# {lib}  python {platform.python_version()}{extra}")
        w("#")

    # ------------------------------------------------------------------ events
    def on_event(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "ranks":
            for r in ev["ranks"]:
                self.write(f"#  Rank {r['rank']:2d} Pid {r['pid']:7d} on {r['host']} rails {','.join(r['rails'])}")
            self.write("#")
        elif kind == "op":
            self._op_header(ev["op"])
        elif kind == "row":
            self._row(ev["op"], ev["records"])

    def _op_header(self, op: str) -> None:
        s = self.spec
        info = OPS[op]
        redop = s.redop if info.reduces else "-"
        root = s.root if info.rooted else "-"
        extra = "  (ping-pong rank 0 <-> 1, one-way time)" if op == "send_recv" else ""
        self.write(f"# {op}  dtype {s.dtype}  redop {redop}  root {root}  world_size {s.world_size}  "
                   f"busbw factor {info.factor(s.world_size):.3f}{extra}")
        lead = " " * len(COLS)
        groups = "".join(f" {b:^{len(GROUP) - 1}}" for b in s.backends)
        for other in self.others:
            groups += f"{'linkescape/' + other:^{len(RATIO_COLS)}}"
        self.write("#" + (lead + groups)[1:].rstrip())
        cols = COLS + GROUP * len(s.backends) + RATIO_COLS * len(self.others)
        units = UNITS0 + UNITS * len(s.backends) + RATIO_UNITS * len(self.others)
        self.write(cols)
        self.write(units.rstrip())

    def _row(self, op: str, records: List[dict]) -> None:
        by = {r["backend"]: r for r in records}
        first = records[0]
        line = f"{first['size']:12d}  {first['count']:12d}  {first['type']:>8}"
        for b in self.spec.backends:
            r = by[b]
            line += f" {fmt_time(r['time_us'])}  {fmt_bw(r['algbw'])}  {fmt_bw(r['busbw'])}  {fmt_wrong(r['wrong'])}"
        for other in self.others:
            rt = ratios(by, other)
            if rt:
                line += f"  {_r(rt[0])}  {_r(rt[1])}"
        self.write(line)
        self.rows.setdefault(op, []).append(by)
        for r in records:
            self.records.append(r)
            if self._json is not None:
                self._json.write(jsonl.encode(r))
        if self._json is not None:
            self._json.flush()

    # ------------------------------------------------------------------ summary
    def finish(self) -> int:
        """Prints the summary; returns the number of wrong elements."""
        w = self.write
        wrong = sum(r["wrong"] or 0 for r in self.records)
        w("#")
        for b in self.spec.backends:
            bws = [r["busbw"] for r in self.records if r["backend"] == b and not OPS[r["op"]].sizeless]
            if bws:
                w(f"# Avg bus bandwidth ({b}) : {statistics.fmean(bws):.3f} GB/s")
        for other in self.others if self.rows else ():
            w("#")
            w(f"# linkescape/{other} per op: busbw ratio > 1 and time ratio < 1 favour linkescape "
              "(geometric mean over sizes [min..max])")
            for op, rows in self.rows.items():
                rs = [ratios(by, other) for by in rows]
                bw = [x[0] for x in rs if x and x[0]]
                tm = [x[1] for x in rs if x and x[1]]
                text = f"#   {op:<15}"
                if bw:
                    text += f" busbw {geomean(bw):5.2f} [{min(bw):.2f}..{max(bw):.2f}]"
                if tm:
                    text += f"   time {geomean(tm):5.2f} [{min(tm):.2f}..{max(tm):.2f}]"
                w(text)
        w("#")
        if self.spec.check:
            w(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        else:
            w("# Out of bounds values : not checked (--no-check)")
        w("#")
        return wrong

    def close(self) -> None:
        if self._json is not None:
            self._json.close()
            self._json = None


# ====================================================================== medians of runs
def load(paths: Iterable[str]) -> List[List[dict]]:
    """Each file's records: a JSON array, or JSON lines (as ``--json`` writes them: jsonl.read)."""
    runs = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        runs.append(json.loads(text) if text.lstrip().startswith("[") else jsonl.read(path))
    return runs


def median_table(runs: List[List[dict]]) -> List[dict]:
    """One row per (op, world_size, type, size): per backend the median time
    over runs (and the busbw at that time), and the median over runs of the
    side-by-side ratios (linkescape/gloo: ``busbw_ratio``, ``time_ratio``;
    linkescape/mpi: ``busbw_ratio_mpi``, ``time_ratio_mpi``). Isolated calls and
    loops are rows of their own (``isolated``)."""
    cells: Dict[tuple, Dict[str, list]] = OrderedDict()
    pairs: Dict[tuple, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        per_key: Dict[tuple, Dict[str, dict]] = defaultdict(dict)
        for r in run:
            key = (r["op"], r["world_size"], r["type"], r["size"], bool(r.get("isolated", False)))
            cells.setdefault(key, defaultdict(list))[r["backend"]].append(r)
            per_key[key][r["backend"]] = r
        for key, by in per_key.items():
            for other in OTHERS:
                rt = ratios(by, other)
                if rt:
                    pairs[key][other].append(rt)
    out = []
    for key, by in cells.items():
        row = {"op": key[0], "world_size": key[1], "type": key[2], "size": key[3], "isolated": key[4]}
        for b, recs in by.items():
            times = [r["time_us"] for r in recs]
            t = statistics.median(times)
            factor = recs[0]["busbw_factor"]
            row[b] = {"time_us": t, "busbw": (key[3] / t / 1e3 * factor) if t > 0 else 0.0, "runs": len(recs),
                      "wrong": sum(r["wrong"] or 0 for r in recs)}
            for k in USAGE:  # per call and rank (the mean rank of a run), the median run
                have = [r[k] for r in recs if r.get(k) is not None]
                if have:
                    row[b][k] = statistics.median(have)
        for other, rs in pairs.get(key, {}).items():
            bw = [x[0] for x in rs if x[0]]
            tm = [x[1] for x in rs if x[1]]
            tail = "" if other == "gloo" else f"_{other}"
            row["busbw_ratio" + tail] = statistics.median(bw) if bw else None
            row["time_ratio" + tail] = statistics.median(tm) if tm else None
            row["busbw_ratios" + tail] = bw
            row["time_ratios" + tail] = tm
        out.append(row)
    return out


def _size_text(n: int) -> str:
    for suffix, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {suffix}"
    return f"{n} B"


def format_medians(rows: List[dict], markdown: bool = False, usage: bool = False) -> str:
    """The table; ``usage`` adds each backend's CPU microseconds and voluntary and
    involuntary context switches per call and rank."""
    backends = [b for b in ("linkescape",) + OTHERS if any(b in r for r in rows)]
    others = [b for b in OTHERS if b in backends] if "linkescape" in backends else []
    head = ["op", "ranks", "size"] + (["timing"] if any(r.get("isolated") for r in rows) else [])
    for b in backends:
        head += [f"{b} time (us)", f"{b} busbw (GB/s)"]
        if usage:
            head += [f"{b} CPU (us/call/rank)", f"{b} vol. cs", f"{b} invol. cs"]
    for other in others:
        head += ["busbw ratio", "time ratio"] if other == "gloo" else [f"busbw ratio /{other}", f"time ratio /{other}"]
    if others:
        head += ["runs"]
    lines = []
    body = []
    for r in rows:
        cells = [r["op"], str(r["world_size"]), _size_text(r["size"])]
        if "timing" in head:
            cells.append("isolated" if r.get("isolated") else "loop")
        for b in backends:
            c = r.get(b)
            cells += ([fmt_time(c["time_us"]).strip(), f"{c['busbw']:.3f}"] if c else ["-", "-"])
            if usage:
                cells += [f"{c[k]:.0f}" if k == "cpu_us" else f"{c[k]:.1f}" if c and k in c else "-" for k in USAGE]
        for other in others:
            tail = "" if other == "gloo" else f"_{other}"
            bw, tm = r.get("busbw_ratio" + tail), r.get("time_ratio" + tail)
            cells += [f"{bw:.2f}" if bw else "-", f"{tm:.2f}" if tm else "-"]
        if others:
            cells.append(str(min(r[b]["runs"] for b in backends if b in r)))
        body.append(cells)
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---:" if i > 0 else "---" for i in range(len(head))) + "|")
        lines.extend("| " + " | ".join(c) + " |" for c in body)
    else:
        widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(head)]
        lines.append("  ".join(h.rjust(wd) for h, wd in zip(head, widths)))
        lines.extend("  ".join(c.rjust(wd) for c, wd in zip(cells, widths)) for cells in body)
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m linkescape.bench.report",
                                 description="Median over runs of `linkescape bench --json` records.")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--usage", action="store_true",
                    help="add CPU time and voluntary/involuntary context switches per call and rank")
    ap.add_argument("--json", dest="json_out", help="write the median rows as JSON here")
    args = ap.parse_args(argv)
    rows = median_table(load(args.files))
    print(format_medians(rows, args.markdown, usage=args.usage))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
