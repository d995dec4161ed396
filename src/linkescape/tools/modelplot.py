"""The cost model's pictures: the savings against cluster size per fabric preset, and against any
swept input; Monte Carlo means with their 95 % bands, the closed form as a dashed line."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .model import SimParams
from .sweep import flag_name

COLORS = {"rail-optimized": "tab:green", "dual-plane": "tab:blue", "tor": "tab:red"}


def _figure(panels: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.3 * panels + 0.6), sharex=True, squeeze=False)
    return plt, fig, [a[0] for a in axes]


def _band(ax, xs, rows: List[Dict[str, Any]], color: str, label: str, scale: float = 1e6) -> None:
    mean = [r["saved"] / scale for r in rows]
    ax.plot(xs, mean, color=color, marker="o", ms=4, label=f"{label}: simulated, 95 % band")
    if rows[0]["trials"] > 1:
        ax.fill_between(xs, [r["saved_ci"][0] / scale for r in rows], [r["saved_ci"][1] / scale for r in rows],
                        color=color, alpha=0.25, lw=0)
    ax.plot(xs, [r["closed_form"] / scale for r in rows], color=color, ls="--", lw=1, label=f"{label}: closed form")


def plot_sizes(path: str, by_cov: Dict[str, List[Dict[str, Any]]], p: SimParams, mark: Optional[int] = None) -> str:
    """Top: yuan saved per run against GPUs, one line and band per fabric preset. Bottom: the
    interruptions avoided and the planned swaps added, per preset."""
    plt, fig, (top, bottom) = _figure(2)
    for cov, rows in by_cov.items():
        xs = [r["value"] for r in rows]
        _band(top, xs, rows, COLORS.get(cov, "k"), cov)
        bottom.plot(xs, [r["interruptions_avoided"] for r in rows], color=COLORS.get(cov, "k"), marker="s", ms=3,
                    label=f"{cov}: interruptions avoided")
        bottom.plot(xs, [r["planned_swaps"] for r in rows], color=COLORS.get(cov, "k"), ls=":", marker="x", ms=3,
                    label=f"{cov}: planned swaps added")
    top.axhline(0, color="gray", lw=0.8)
    top.set_ylabel("million yuan saved per run\nescape vs restart")
    top.set_title(f"{p.days:g}-day run, {p.gpus_per_host} GPUs and {p.rails} rails per host, {p.policy}, no-path wait "
                  f"{p.no_path_s:g} s, relay {'on' if p.relay else 'off'}; {by_cov[next(iter(by_cov))][0]['trials']} "
                  "paired trials per point", fontsize=9)
    bottom.set_ylabel("per run")
    bottom.set_xlabel("GPUs in the cluster")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="upper left", fontsize=7, ncol=2)
        if mark is not None:
            ax.axvline(mark, color="gray", ls=":", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(path: str, rows: List[Dict[str, Any]], p: SimParams, label: str = "escape") -> str:
    """The savings against one swept input, with the band, the closed form, and the ETTR of both modes."""
    plt, fig, (top, bottom) = _figure(2)
    values = [r["value"] for r in rows]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    xs = values if numeric else list(range(len(values)))
    _band(top, xs, rows, "tab:green", label)
    top.axhline(0, color="gray", lw=0.8)
    top.set_ylabel("million yuan saved per run\nescape vs restart")
    name = flag_name(rows[0]["param"])
    top.set_title(f"--sweep {name}: {p.gpus:,} GPUs, {p.rails} rails per host, fabric {p.coverage}, {p.policy}; "
                  f"{rows[0]['trials']} paired trials per point", fontsize=9)
    bottom.plot(xs, [r["ettr_restart"] for r in rows], color="tab:red", marker="o", ms=4,
                label="restart from checkpoint")
    bottom.plot(xs, [r["ettr_escape"] for r in rows], color="tab:green", marker="o", ms=4, label="escape")
    bottom.set_ylabel("ETTR (simulated)")
    bottom.set_xlabel(name)
    if not numeric:
        bottom.set_xticks(xs)
        bottom.set_xticklabels([str(v) for v in values])
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plot_sizes", "plot_sweep"]
