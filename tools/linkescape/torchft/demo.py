"""``linkescape demo --torchft``: torchft training through both kinds of fault, linkescape's group beside
torchft's Gloo group.

On one testbed (4 hosts x 2 rails at 1 Gbit/s) it runs :mod:`.run` four times: each backend with host 3
cut off from every link, then with its process killed; it writes ``report.md`` and ``report.json``
(:mod:`.analysis`: per fault, steps committed per minute, discarded, quorum changes, the longest time
without a commit; the time to leave host 3 out and to rejoin) and ``timeline.png``: per run, the steps
committed and the replica count over time, with the faults shaded. Needs root (the testbed); takes
about 5 minutes (311 s on this 2-core machine).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Sequence, Tuple

from ..common import extras

#: (backend, how host 3 is lost), in the order they run
RUNS: Tuple[Tuple[str, str], ...] = (("linkescape", "links"), ("gloo", "links"), ("linkescape", "kill"),
                                     ("gloo", "kill"))
_COLOURS = {"cut": "#f4a261", "blackhole": "#9b5de5", "flap": "#2a9d8f", "host": "#e63946"}


def run_demo(out: str, say=print, runs: Sequence[Tuple[str, str]] = RUNS) -> Dict[str, Any]:
    extras.require(["torch", "torchft", "matplotlib"], "torchft", "linkescape demo --torchft")
    from ..demo.controller import testbed_unavailable
    from ..testbed.netns import temporary_testbed
    from .analysis import analyse, table
    from .run import Options, run_training

    reason = testbed_unavailable()
    if reason is not None:
        raise RuntimeError(f"linkescape demo --torchft needs a testbed: {reason}")
    os.makedirs(out, exist_ok=True)
    started = time.time()
    reports: List[Dict[str, Any]] = []
    results: List[Dict[str, Any]] = []
    with temporary_testbed(4, 2, rate="1gbit", prefix="tftd") as tb:
        for backend, whole in runs:
            say(f"run: torchft with {backend}'s group, host 3 {'killed' if whole == 'kill' else 'cut off'} ...")
            res = run_training(tb, Options(backend=backend, whole=whole), os.path.join(out, f"{backend}-{whole}"))
            results.append(res)
            reports.append(analyse(res))
    md = ["# linkescape demo --torchft", "",
          "4 replica groups (one per testbed host, 2 rails at 1 Gbit/s), torchft 0.2.0's Manager and lighthouse, "
          "gradients averaged with `manager.allreduce`. Faults, one after the other: host 1's rail 0 cut, host 2's "
          "rail 0 blackholed, host 3's rail 0 flapped, then host 3 loses every link (its rails and its management "
          "link) or its process is killed, and comes back 15 s later. Seen from replica 0; 'discarded': step "
          "attempts torchft did not commit.", "", table(reports), ""]
    rep = {"runs": reports, "runtime_s": round(time.time() - started, 1)}
    png = os.path.join(out, "timeline.png")
    try:
        plot(png, results, reports)
        rep["timeline_png"] = os.path.abspath(png)
        md.append("![timeline](timeline.png)")
    except Exception as exc:  # noqa: BLE001 - the report is still worth writing
        rep["timeline_png"] = None
        md.append(f"timeline picture failed: {type(exc).__name__}: {exc}")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1, default=str)
    rep["report_md"] = os.path.abspath(os.path.join(out, "report.md"))
    rep["table"] = table(reports)
    return rep


def _series(result: Dict[str, Any], observer: int = 0):
    recs = result["records"].get(observer) or result["records"].get(str(observer)) or []
    t0 = result.get("t_together") or 0.0
    steps = [r for r in recs if "t" in r]
    committed = [(r["t"] - t0, i + 1) for i, r in enumerate([r for r in steps if r.get("committed")])]
    discarded = [r["t"] - t0 for r in steps if not r.get("committed")]
    replicas = [(r["t"] - t0, r.get("participants") or 0) for r in steps]
    return committed, discarded, replicas


def plot(path: str, results: List[Dict[str, Any]], reports: List[Dict[str, Any]]) -> None:
    """Per run: committed steps (left axis) and the replica count (right axis) over time, faults shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    for k, (res, rep) in enumerate(zip(results, reports)):
        ax = axes[k // cols][k % cols]
        t0 = res.get("t_together") or 0.0
        committed, discarded, replicas = _series(res)
        for f in res.get("faults") or []:
            end = (f.get("repaired") or f["at"]) - t0
            ax.axvspan(f["at"] - t0, max(end, f["at"] - t0 + 0.3), color=_COLOURS.get(f["what"], "grey"), alpha=0.25,
                       label={"cut": "cable cut", "blackhole": "blackholed optic", "flap": "flap",
                              "host": "host 3 lost"}.get(f["what"], f["what"]))
        if committed:
            ax.plot([c[0] for c in committed], [c[1] for c in committed], color="black", lw=1.2,
                    label="steps committed")
        if discarded:
            ax.plot(discarded, [0] * len(discarded), "x", color="red", ms=4, label="step discarded")
        ax.set_xlabel("seconds since all 4 replicas trained")
        ax.set_ylabel("steps committed (replica 0)")
        ax2 = ax.twinx()
        if replicas:
            ax2.step([r[0] for r in replicas], [r[1] for r in replicas], where="post", color="tab:blue", lw=1.5,
                     label="replicas in the quorum")
        ax2.set_ylim(0, 4.6)
        ax2.set_ylabel("replicas", color="tab:blue")
        host = "killed" if rep["whole"] == "kill" else "cut off"
        same = "same parameters" if rep["same_parameters"] else "did NOT finish with the same parameters"
        ax.set_title(f"torchft + {rep['backend']}: host 3 {host} ({same})", fontsize=10)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_cli(out: str, quiet: bool, console=None) -> int:
    """What ``linkescape demo --torchft`` runs; the exit status (0: linkescape's runs met the issue's bars)."""
    say = (lambda *a: None) if quiet else (console.print if console is not None else print)
    rep = run_demo(out, say=say)
    print(rep["table"])
    print(f"report: {rep['report_md']}; timeline: {rep.get('timeline_png')}")
    ok = all(r["same_parameters"] for r in rep["runs"] if r["backend"] == "linkescape")
    return 0 if ok else 1


__all__ = ["run_demo", "plot", "RUNS", "main_cli"]
