#!/usr/bin/env python3
"""Regenerate the numbers of docs/operations.md's cost and simulate sections from the commands
shown beside them.

The document marks what this script owns:

- ``<!-- run: linkescape ARGS -->`` ... ``<!-- /run -->``: a fenced block with ``$ linkescape ARGS``
  and what the command printed;
- ``<!-- table: NAME -->`` ... ``<!-- /table -->``: a table built by ``TABLES[NAME]`` from the
  commands it names in its first column;
- ``<!-- v: NAME -->`` value ``<!-- /v -->``: one number, ``VALUES[NAME]``, from the command the
  text names beside it;
- ``<!-- plot: linkescape ARGS -->``: a command run for the picture it writes.

A command may read ``failures.csv``: the CSV block that follows ``<!-- file: failures.csv -->``
in the document, written to a temporary directory first.

    python scripts/operations_numbers.py           # rewrite docs/operations.md
    python scripts/operations_numbers.py --check   # exit 1 if it is not current
    python scripts/operations_numbers.py --list    # the commands, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
from typing import Callable, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "operations.md")

RUN = re.compile(r"<!-- run: (linkescape [^>]*?) -->\n.*?<!-- /run -->", re.S)
TABLE = re.compile(r"<!-- table: ([a-z-]+) -->\n.*?<!-- /table -->", re.S)
VALUE = re.compile(r"<!-- v: ([a-z0-9_.-]+) -->.*?<!-- /v -->", re.S)
PLOT = re.compile(r"<!-- plot: (linkescape [^>]*?) -->")
FILE = re.compile(r"<!-- file: ([\w.-]+) -->\n```[a-z]*\n(.*?)```", re.S)


class Runner:
    """Runs ``linkescape`` commands in this process (in the repository root), once each."""

    def __init__(self, files: Dict[str, str]) -> None:
        self.cache: Dict[str, str] = {}
        self.tmp = tempfile.mkdtemp(prefix="operations-numbers-")
        for name, text in files.items():
            with open(os.path.join(self.tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)

    def text(self, command: str) -> str:
        if command not in self.cache:
            from click.testing import CliRunner

            from linkescape.cli import main

            args = [os.path.join(self.tmp, a) if os.path.exists(os.path.join(self.tmp, a)) else a
                    for a in shlex.split(command)[1:]]
            print(f"  $ {command}", file=sys.stderr, flush=True)
            res = CliRunner().invoke(main, args, prog_name="linkescape", catch_exceptions=False)
            if res.exit_code != 0:
                raise SystemExit(f"{command}: exit {res.exit_code}\n{res.output}")
            self.cache[command] = res.output.replace(self.tmp + os.sep, "")
        return self.cache[command]

    def json(self, command: str) -> dict:
        return json.loads(self.text(command + " --json"))


def _y(v: float) -> str:
    return f"{v:,.0f}"


# ------------------------------------------------------------------ tables
AGREE = ["", "--coverage rail-optimized", "--coverage dual-plane", "--no-path-seconds 1800",
         "--flap-share 0 --reboot-share 0", "--rails 2", "--rails 2 --no-relay", "--rails 2 --policy stripe",
         "--gpus 100000"]


def table_agree(r: Runner) -> List[str]:
    rows = ["| inputs (the same for both) | `linkescape cost`: saved per run | `linkescape simulate`: saved per run "
            "| 95 % CI of the mean | closed form inside |", "|---|---|---|---|---|"]
    for args in AGREE:
        c = r.json(f"linkescape cost {args}".strip())
        s = r.json(f"linkescape simulate {args}".strip())["saved"]["escape"]
        lo, hi = s["yuan_saved_ci"]
        inside = "yes" if lo <= c["yuan_saved"] <= hi else "**no**"
        rows.append(f"| `{args or '(defaults)'}` | {_y(c['yuan_saved'])} | {_y(s['yuan_saved'])} "
                    f"| {_y(lo)} to {_y(hi)} | {inside} |")
    return rows


def table_seeds(r: Runner) -> List[str]:
    rows = ["| command | saved per run | 95 % CI of the mean | one run's sd |", "|---|---|---|---|"]
    for seed in (0, 1, 2):
        cmd = f"linkescape simulate --coverage rail-optimized --seed {seed}"
        s = r.json(cmd)["saved"]["escape"]
        lo, hi = s["yuan_saved_ci"]
        rows.append(f"| `{cmd}` | {_y(s['yuan_saved'])} | {_y(lo)} to {_y(hi)} | {_y(s['yuan_saved_run_sd'])} |")
    return rows


def table_band(r: Runner) -> List[str]:
    rows = ["| `--coverage` | `linkescape cost --coverage X` | rates' 95 % band | with `--no-path-seconds 1800` "
            "| with `--rails 2` | with `--rails 2 --no-relay` |", "|---|---|---|---|---|---|"]
    for cov in ("rail-optimized", "dual-plane", "tor"):
        d = r.json(f"linkescape cost --coverage {cov}")
        w = r.json(f"linkescape cost --coverage {cov} --no-path-seconds 1800")["yuan_saved"]
        two = r.json(f"linkescape cost --coverage {cov} --rails 2")["yuan_saved"]
        relay = r.json(f"linkescape cost --coverage {cov} --rails 2 --no-relay")["yuan_saved"]
        rb = d["rate_band"]
        rows.append(f"| {cov} | {_y(d['yuan_saved'])} | {_y(rb['lo'])} to {_y(rb['hi'])} | {_y(w)} | {_y(two)} "
                    f"| {_y(relay)} |")
    return rows


def table_baselines(r: Runner) -> List[str]:
    rows = ["| way of meeting a fault | ETTR (`linkescape cost`) | interruptions | planned swaps | saved vs restart "
            "| the same, `--coverage rail-optimized` |", "|---|---|---|---|---|---|"]
    d, ro = r.json("linkescape cost"), r.json("linkescape cost --coverage rail-optimized")
    labels = {"restart": "restart from checkpoint", "escape": "escape (linkescape, active-backup)",
              "nccl": "NCCL 2.30 port failover", "torchft": "torchft FT-HSDP",
              "escape_torchft": "escape + shrink/torchft"}
    for m, label in labels.items():
        saved = d["saved"].get(m, {}).get("yuan_saved", 0.0)
        saved_ro = ro["saved"].get(m, {}).get("yuan_saved", 0.0)
        ft = m in ("torchft", "escape_torchft")
        ints = f"- ({d[m]['left_out']:.1f} groups left out)" if ft else f"{d[m]['interruptions']:.1f}"
        swaps = "-" if ft else f"{d[m].get('planned_swaps', 0.0):.1f}"
        rows.append(f"| {label} | {d[m]['ettr']:.4f} | {ints} | {swaps} | {_y(saved)} | {_y(saved_ro)} |")
    return rows


TABLES: Dict[str, Callable[[Runner], List[str]]] = {"agree": table_agree, "seeds": table_seeds,
                                                     "band": table_band, "baselines": table_baselines}

# ------------------------------------------------------------------ values in the text
VALUES: Dict[str, Tuple[str, Callable[[dict], str]]] = {
    "restart-ettr": ("linkescape cost", lambda d: f"{d['restart']['ettr']:.3f}"),
    "escape-ettr": ("linkescape cost", lambda d: f"{d['escape']['ettr']:.3f}"),
    "per-interruption": ("linkescape cost", lambda d: f"{d['hours_per_interruption']:.3f}"),
    "interval": ("linkescape cost", lambda d: f"{d['resolved']['checkpoint_hours']:.3f}"),
    "mtbf": ("linkescape cost", lambda d: f"{d['resolved']['mtbf_hours']:.2f}"),
    "network-lost": ("linkescape cost", lambda d: _y(d["lost_yuan"])),
    "saved": ("linkescape cost", lambda d: _y(d["yuan_saved"])),
    "avoided": ("linkescape cost", lambda d: f"{d['saved']['escape']['interruptions_avoided']:.1f}"),
    "waited": ("linkescape cost", lambda d: f"{d['escape']['wait_hours']:.1f}"),
    "saved-1800": ("linkescape cost --no-path-seconds 1800", lambda d: _y(d["yuan_saved"])),
    "ft-saved": ("linkescape cost", lambda d: _y(d["saved"]["torchft"]["yuan_saved"])),
    "ft-escape-adds": ("linkescape cost", lambda d: _y(d["saved"]["escape_torchft"]["yuan_saved"]
                                                       - d["saved"]["torchft"]["yuan_saved"])),
    "ft-one-rail": ("linkescape cost", lambda d: f"{d['one_rail_faults']:.1f}"),
    "restart-cost": ("linkescape cost --break-even", lambda d: _y(d["restart_cost_s"])),
    "best-wait": ("linkescape cost --break-even", lambda d: f"{d['best_wait_s']:g}"),
    "near-lo": ("linkescape cost --break-even", lambda d: f"{d['optimum']['within_1pct_lo']:g}"),
    "near-hi": ("linkescape cost --break-even", lambda d: f"{d['optimum']['within_1pct_hi']:g}"),
    "saved-rail": ("linkescape cost --coverage rail-optimized", lambda d: _y(d["yuan_saved"])),
    "saved-dual": ("linkescape cost --coverage dual-plane", lambda d: _y(d["yuan_saved"])),
    "nic-lo": ("linkescape cost", lambda d: f"{d['rate_band']['nic_interval'][0]:.2f}"),
    "nic-hi": ("linkescape cost", lambda d: f"{d['rate_band']['nic_interval'][1]:.2f}"),
    "rates-lo": ("linkescape cost", lambda d: _y(d["rate_band"]["lo"])),
    "rates-hi": ("linkescape cost", lambda d: _y(d["rate_band"]["hi"])),
    "sim-saved": ("linkescape simulate", lambda d: _y(d["saved"]["escape"]["yuan_saved"])),
    "sim-lo": ("linkescape simulate", lambda d: _y(d["saved"]["escape"]["yuan_saved_ci"][0])),
    "sim-hi": ("linkescape simulate", lambda d: _y(d["saved"]["escape"]["yuan_saved_ci"][1])),
    "sim-sd": ("linkescape simulate", lambda d: _y(d["saved"]["escape"]["yuan_saved_run_sd"])),
    "net-lo": ("linkescape cost", lambda d: f"{d['rate_band']['network_interval'][0]:.2f}"),
    "net-hi": ("linkescape cost", lambda d: f"{d['rate_band']['network_interval'][1]:.2f}"),
    "seed-68": ("linkescape cost --scenario seed-article", lambda d: _ettr_bound(d["inputs"])),
}


def _ettr_bound(i: dict) -> str:
    return f"{1 - i['interruptions'] * i['recovery_hours'] / (i['days'] * 24):.0%}"


def regenerate(text: str, r: Runner, plots: bool) -> str:
    def run_block(m: re.Match) -> str:
        cmd = m.group(1)
        return f"<!-- run: {cmd} -->\n```\n$ {cmd}\n{r.text(cmd).rstrip()}\n```\n<!-- /run -->"

    def table_block(m: re.Match) -> str:
        name = m.group(1)
        if name not in TABLES:
            raise SystemExit(f"docs/operations.md: no table named {name!r}")
        return f"<!-- table: {name} -->\n" + "\n".join(TABLES[name](r)) + "\n<!-- /table -->"

    def value(m: re.Match) -> str:
        name = m.group(1)
        if name not in VALUES:
            raise SystemExit(f"docs/operations.md: no value named {name!r}")
        cmd, get = VALUES[name]
        return f"<!-- v: {name} -->{get(r.json(cmd))}<!-- /v -->"

    if plots:
        for cmd in PLOT.findall(text):
            r.text(cmd)
    text = RUN.sub(run_block, text)
    text = TABLE.sub(table_block, text)
    return VALUE.sub(value, text)


def commands(text: str) -> List[str]:
    out = PLOT.findall(text) + RUN.findall(text)
    out += [f"(table {t})" for t in TABLE.findall(text)]
    out += sorted({VALUES[v][0] + " --json" for v in VALUE.findall(text) if v in VALUES})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/operations.md is not current")
    ap.add_argument("--list", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--no-plots", action="store_true", help="leave the pictures as they are")
    ap.add_argument("--doc", default=DOC)
    a = ap.parse_args()
    text = open(a.doc, encoding="utf-8").read()
    if a.list:
        print("\n".join(commands(text)))
        return 0
    os.chdir(ROOT)
    runner = Runner(dict(FILE.findall(text)))
    new = regenerate(text, runner, plots=not (a.no_plots or a.check))
    if a.check:
        if new != text:
            import difflib

            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "docs", "now", n=0))
            return 1
        print("docs/operations.md is current")
        return 0
    if new != text:
        with open(a.doc, "w", encoding="utf-8") as fh:
            fh.write(new)
    print(f"{a.doc}: {len(runner.cache)} commands run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
