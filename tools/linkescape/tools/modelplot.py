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


def plot_tornado(path: str, d: Dict[str, Any], p: SimParams, sim: Optional[Dict[str, Any]] = None) -> str:
    """One bar per input: escape's savings (closed form) with the input at the low and the high end of
    its range, every other input at its default; the widest swing on top. ``sim``: the simulation's
    saved-per-run interval at the defaults, drawn at the base line."""
    from .tornado import label, value

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = d["rows"]
    base = d["base"] / 1e6
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.9))
    ys = list(range(len(rows)))[::-1]
    span = max(max(abs(r["saved_low"] - d["base"]), abs(r["saved_high"] - d["base"])) for r in rows) / 1e6 or 1.0
    for y, r in zip(ys, rows):
        lo, hi = r["saved_low"] / 1e6, r["saved_high"] / 1e6
        if max(abs(lo - base), abs(hi - base)) < 0.01 * span:
            ax.annotate(f"no effect from {value(r, 'low')} to {value(r, 'high')}", (base, y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7, color="gray")
            continue
        ends = sorted(((lo, "tab:blue", "low"), (hi, "tab:orange", "high")), key=lambda e: -abs(e[0] - base))
        for v, color, end in ends:
            ax.barh(y, v - base, left=base, color=color, alpha=0.85 if r["kind"] == "assumed" else 0.45,
                    edgecolor="k", lw=0.4)
            ax.annotate(value(r, end), (v, y), xytext=(4 if v >= base else -4, 0), textcoords="offset points",
                        va="center", ha="left" if v >= base else "right", fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.1)
    ax.set_yticks(ys)
    ax.set_yticklabels([label(r) + (" [published]" if r["kind"] == "published" else "") for r in rows], fontsize=8)
    ax.axvline(base, color="k", lw=1)
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    if sim is not None:
        lo, hi = (v / 1e6 for v in sim["yuan_saved_ci"])
        ax.errorbar([sim["yuan_saved"] / 1e6], [len(rows) - 0.35], xerr=[[sim["yuan_saved"] / 1e6 - lo],
                    [hi - sim["yuan_saved"] / 1e6]], fmt="o", color="k", ms=3, capsize=3,
                    label="simulated at the defaults, 95 % CI")
    from matplotlib.patches import Patch

    handles = ax.get_legend_handles_labels()[0] + [Patch(color="tab:blue", label="input at the low end of its range"),
                                                   Patch(color="tab:orange", label="input at the high end")]
    ax.set_xlabel("million yuan saved per run, escape vs restart (closed form); dashed: 0")
    ax.set_title(f"escape at the defaults: {base:.2f}M yuan per run ({p.gpus:,} GPUs, {p.rails} rails, {p.coverage}, "
                 f"no-path wait {p.no_path_s:g} s); each assumed input across its range", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(handles=handles, loc="lower right", fontsize=7)
    lo_all = min(min(r["saved_low"], r["saved_high"]) for r in rows) / 1e6
    hi_all = max(max(r["saved_low"], r["saved_high"]) for r in rows) / 1e6
    pad = 0.12 * (hi_all - min(lo_all, 0))
    ax.set_xlim(min(lo_all, 0) - pad, hi_all + pad)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plot_sizes", "plot_sweep", "plot_tornado"]
