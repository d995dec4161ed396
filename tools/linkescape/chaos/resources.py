"""Every rank's memory, descriptors and threads over a chaos run: the samples, their trend, the picture.

The controller reads ``/proc/PID/status`` and ``/proc/PID/fd`` of every rank
every ``--resource-interval`` seconds (5 s) and appends one line to
``resources.jsonl``: ``{"t", "part", "ranks": [{"rss_mb", "fds", "threads"} or
null, ...]}``. :func:`trends` fits a least-squares line through each rank's
samples after its warm-up (per part: a part's ranks are new processes) and
gives the slope per hour with its standard error, the growth the line makes
over the part, and whether that is flat. :func:`plot` draws RSS (and fds,
threads) over time.

*Flat*, judged only for parts of at least :data:`JUDGE_MIN_S` (shorter ones
are reported, not judged: a few minutes of allocator noise give any slope):
the slope of RSS's *floor* <= :data:`RSS_LIMIT_MB_PER_H`, and the *robust*
(Theil-Sen) slopes of fds and threads through every sample <=
:data:`COUNT_LIMIT_PER_H` (a rank's links are re-opened during faults, so
its descriptors come and go; a leak grows without end).

RSS's floor is the lowest sample of each :data:`FLOOR_WINDOW_S`, and its line
is fitted through those. Under faults a rank's RSS is what it keeps plus what
the outage of the moment holds (replay, stash, relayed frames: bounded by
configuration, freed when the path is back): never less, often tens of MB
more, from one sample to the next. Through every sample, a 30-minute part's
line has a standard error of 7-8 MB/h (measured, seeds 61 and 83; the floor's 1.4-3.9), so a flat
rank fails a 16 MB/h limit now and then, and one that keeps 15 MB/h may pass;
what a rank keeps shows between outages, in the floor, whose scatter is a few
MB. Descriptors swing both ways around the healthy count (links closed while
down, dials in flight), so neither the floor nor a line through every sample
tells a leak from the faults of the moment: a least-squares line follows when
the bursts fell (the hour at seed 83: +3.1/h on a rank whose fds were 23 at
every quiet moment, first to last, and 6 after ``close()``), and so does the
Theil-Sen (median pairwise) line when the faults of a schedule crowd one end
of a part (the hour at seed 179: +2.7/h on a rank whose usual count was 23 in
every 5 minutes but the first). So did the most common sample of each
window (the hour at seed 277: +4.3/h on a rank whose samples lay between 18
and 24 in every 2 minutes and never above 24: with links down most of the
time, the most common value jumped between 20 and 24 from window to window).

A count is judged on its *ceiling*: the highest sample of each
:data:`COUNT_WINDOW_S`, and the Theil-Sen line through those. Faults only
take descriptors away (a link closed while down) or add one for a moment (a
dial in flight); a rank's full set of links is open at some moment of almost
every 2 minutes, so the ceiling is that set, window after window (24 in every
window of every rank of the hours at seeds 211, 251, 257 and 277). A leaked
descriptor is never closed, so it adds to the ceiling from then on, whatever
the faults do. Its resolution is the part: one descriptor over a 30-minute
part is 2/h; a leak of one per 15 minutes shows. The least-squares line
through every sample and through the floor, the Theil-Sen line through every
sample and through each window's most common value (``usual``) are reported
for every key too.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..common import jsonl

#: parts shorter than this are not judged for flatness (the trend is reported)
JUDGE_MIN_S = 600.0
#: the first part of each part's samples not fitted: min(WARMUP_S, WARMUP_SHARE x the part's length)
WARMUP_S = 60.0
WARMUP_SHARE = 0.2
#: a rank's RSS may trend up by at most this (MB per hour) over a judged part
RSS_LIMIT_MB_PER_H = 16.0
#: fds and threads: at most this many per hour
COUNT_LIMIT_PER_H = 2.0
#: the floor: the lowest sample of each window of this many seconds
FLOOR_WINDOW_S = 60.0
KEYS = ("rss_mb", "fds", "threads")
#: judged on the floor (the others on the line through each window's highest sample; see the module's doc)
FLOOR_KEYS = ("rss_mb",)
#: the ceiling (and the usual value, reported) of a count: the highest (most common) sample of each window of
#: this many seconds
COUNT_WINDOW_S = 120.0
#: at most this many samples go into a robust line (evenly spaced): its pairs grow as the square
ROBUST_MAX_SAMPLES = 1500
LIMITS = {"rss_mb": RSS_LIMIT_MB_PER_H, "fds": COUNT_LIMIT_PER_H, "threads": COUNT_LIMIT_PER_H}


def heap(rdir: str) -> Dict[int, List[Dict[str, Any]]]:
    """What each rank's heap held (the workers' ``heap-RANK.jsonl``, one line a minute), per process
    (a part's ranks are new processes: its steps start again), after the first minute: Python's
    allocated blocks first -> last, and glibc's bytes in use at their lowest in the first and the last
    half. A leak of objects grows the blocks; one of C memory the lowest bytes in use; both flat while
    RSS's floor rises is the allocator's (fragmentation, arenas)."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for name in sorted(os.listdir(rdir)) if os.path.isdir(rdir) else ():
        if not (name.startswith("heap-") and name.endswith(".jsonl")):
            continue
        try:
            rank = int(name[5:-6])
        except ValueError:
            continue
        procs: List[List[Dict[str, Any]]] = []
        for rec in jsonl.read(os.path.join(rdir, name)):
            if not procs or rec.get("steps", 0) < procs[-1][-1].get("steps", 0):
                procs.append([])
            procs[-1].append(rec)
        rows = []
        for recs in procs:
            keep = [r for r in recs if r["t"] >= recs[0]["t"] + WARMUP_S]
            if len(keep) < 2:
                continue
            half = len(keep) // 2
            row: Dict[str, Any] = {"samples": len(keep), "minutes": round((keep[-1]["t"] - keep[0]["t"]) / 60.0, 1),
                                   "py_blocks": [keep[0].get("py_blocks"), keep[-1].get("py_blocks")]}
            if all("in_use" in r for r in keep):
                row["in_use_mb_low"] = [round(min(r["in_use"] for r in keep[:half]) / 2 ** 20, 1),
                                        round(min(r["in_use"] for r in keep[half:]) / 2 ** 20, 1)]
            rows.append(row)
        out[rank] = rows
    return out


def load(rdir: str) -> List[Dict[str, Any]]:
    """The samples of a run directory (empty for runs made before they were taken)."""
    path = os.path.join(rdir, "resources.jsonl")
    return jsonl.read(path) if os.path.exists(path) else []


def series(samples: Sequence[Mapping[str, Any]]) -> Dict[Any, Dict[int, Dict[str, List[float]]]]:
    """``{part: {rank: {"t": [...], "rss_mb": [...], "fds": [...], "threads": [...]}}}``."""
    out: Dict[Any, Dict[int, Dict[str, List[float]]]] = {}
    for s in samples:
        for rank, r in enumerate(s.get("ranks") or []):
            if not r:
                continue
            d = out.setdefault(s.get("part"), {}).setdefault(rank, {"t": [], **{k: [] for k in KEYS}})
            d["t"].append(float(s["t"]))
            for k in KEYS:
                d[k].append(float(r.get(k, np.nan)))
    return out


def fit(t: Sequence[float], y: Sequence[float]) -> Optional[Dict[str, float]]:
    """Least-squares line through (t seconds, y): slope per hour, its standard error, and the fitted
    growth from the first to the last sample; None with fewer than 3 samples."""
    t_arr, y_arr = np.asarray(t, float), np.asarray(y, float)
    ok = np.isfinite(t_arr) & np.isfinite(y_arr)
    t_arr, y_arr = t_arr[ok], y_arr[ok]
    n = t_arr.size
    if n < 3 or np.ptp(t_arr) <= 0:
        return None
    h = (t_arr - t_arr[0]) / 3600.0
    slope, icept = np.polyfit(h, y_arr, 1)
    resid = y_arr - (slope * h + icept)
    sxx = float(((h - h.mean()) ** 2).sum())
    se = float(np.sqrt((resid ** 2).sum() / (n - 2) / sxx)) if n > 2 and sxx > 0 else float("nan")
    return {"per_hour": float(slope), "stderr_per_hour": se, "growth": float(slope * (h[-1] - h[0])),
            "intercept": float(icept), "t0": float(t_arr[0]),
            "first": float(y_arr[0]), "last": float(y_arr[-1]), "min": float(y_arr.min()), "max": float(y_arr.max()),
            "n": int(n), "hours": float(h[-1] - h[0])}


def robust(t: Sequence[float], y: Sequence[float]) -> Optional[Dict[str, float]]:
    """The Theil-Sen line through (t seconds, y): the median of the slopes between every two samples
    (per hour) and the median intercept; None with fewer than 3 samples. Longer series are thinned
    evenly to :data:`ROBUST_MAX_SAMPLES` first."""
    t_arr, y_arr = np.asarray(t, float), np.asarray(y, float)
    ok = np.isfinite(t_arr) & np.isfinite(y_arr)
    t_arr, y_arr = t_arr[ok], y_arr[ok]
    if t_arr.size < 3 or np.ptp(t_arr) <= 0:
        return None
    if t_arr.size > ROBUST_MAX_SAMPLES:
        pick = np.linspace(0, t_arr.size - 1, ROBUST_MAX_SAMPLES).round().astype(int)
        t_arr, y_arr = t_arr[pick], y_arr[pick]
    h = (t_arr - t_arr[0]) / 3600.0
    i, j = np.triu_indices(h.size, 1)
    dh = h[j] - h[i]
    keep = dh > 0
    slope = float(np.median((y_arr[j] - y_arr[i])[keep] / dh[keep]))
    icept = float(np.median(y_arr - slope * h))
    return {"per_hour": slope, "growth": slope * float(h[-1]), "intercept": icept, "t0": float(t_arr[0]),
            "n": int(t_arr.size), "hours": float(h[-1])}


def _windows(t: Sequence[float], y: Sequence[float], window: float) -> List[List[tuple]]:
    """The finite samples ``(t, y)`` in each ``window`` seconds from the first sample, in time order."""
    groups: Dict[int, List[tuple]] = {}
    for ti, yi in zip(t, y):
        if np.isfinite(yi):
            groups.setdefault(int((ti - t[0]) // window), []).append((ti, yi))
    return [groups[k] for k in sorted(groups)]


def floor(t: Sequence[float], y: Sequence[float], window: float = FLOOR_WINDOW_S) -> tuple:
    """The lowest sample (its time and value) of each ``window`` seconds from the first sample."""
    pts = [min(w, key=lambda p: p[1]) for w in _windows(t, y, window)]
    return [p[0] for p in pts], [p[1] for p in pts]


def ceiling(t: Sequence[float], y: Sequence[float], window: float = COUNT_WINDOW_S) -> tuple:
    """The highest sample of each ``window`` seconds from the first sample, at the window's middle
    sample's time."""
    ts, ys = [], []
    for w in _windows(t, y, window):
        ts.append(w[len(w) // 2][0])
        ys.append(max(yi for _, yi in w))
    return ts, ys


def usual(t: Sequence[float], y: Sequence[float], window: float = COUNT_WINDOW_S) -> tuple:
    """The most common sample of each ``window`` seconds from the first sample (the larger on a tie),
    at the window's middle sample's time."""
    ts, ys = [], []
    for w in _windows(t, y, window):
        counts = Counter(yi for _, yi in w)
        top = max(counts.values())
        ts.append(w[len(w) // 2][0])
        ys.append(max(v for v, c in counts.items() if c == top))
    return ts, ys


def trends(samples: Sequence[Mapping[str, Any]], parts: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per part and rank: the fitted slope per hour of RSS, fds and threads after warm-up (through
    every sample, through the floor: ``row["floor"][key]``, robust through every sample:
    ``row["robust"][key]``, robust through each window's most common value: ``row["usual"][key]``, and
    robust through each window's highest sample: ``row["ceiling"][key]``), and the verdict (RSS on its
    floor, fds and threads on their ceilings' line).

    ``parts``: ``{"part", "policy", "t_start", "t_end"}`` of each part played (``t_start``/``t_end``: wall
    times). Returns ``{"parts": [...], "flat": bool or None (nothing judged), "reasons": [...],
    "max_per_hour": {key: largest slope}}``."""
    by_part = series(samples)
    out_parts = []
    reasons: List[str] = []
    judged_any = False
    worst = {k: None for k in KEYS}
    for p in parts:
        ranks = by_part.get(p.get("part"), {})
        if not ranks:
            continue
        ts = [t for d in ranks.values() for t in d["t"]]
        t_a, t_b = min(ts), max(ts)
        length = t_b - t_a
        skip = min(WARMUP_S, WARMUP_SHARE * length)
        judged = length >= JUDGE_MIN_S
        judged_any |= judged
        rows = {}
        for rank, d in sorted(ranks.items()):
            keep = [i for i, t in enumerate(d["t"]) if t >= t_a + skip]
            row: Dict[str, Any] = {"samples": len(d["t"]), "fitted": len(keep), "floor": {}, "robust": {},
                                   "usual": {}, "ceiling": {}}
            for k in KEYS:
                t, y = [d["t"][i] for i in keep], [d[k][i] for i in keep]
                row[k] = fit(t, y)
                row["floor"][k] = fit(*floor(t, y))
                row["robust"][k] = robust(t, y)
                row["usual"][k] = robust(*usual(t, y))
                row["ceiling"][k] = robust(*ceiling(t, y))
                f = judged_line(row, k)
                if f is None:
                    continue
                if worst[k] is None or f["per_hour"] > worst[k]:
                    worst[k] = f["per_hour"]
                if judged and f["per_hour"] > LIMITS[k]:
                    what = f"{k}'s floor" if k in FLOOR_KEYS else f"{k}'s ceiling"
                    reasons.append(f"part {p.get('part') or 1} rank {rank}: {what} grows {f['per_hour']:+.1f}/h "
                                   f"(limit {LIMITS[k]:g}/h)")
            rows[rank] = row
        out_parts.append({"part": p.get("part"), "policy": p.get("policy"), "t0": t_a, "t1": t_b,
                          "warmup_s": skip, "judged": judged, "ranks": rows})
    return {"parts": out_parts, "flat": (not reasons) if judged_any else None, "reasons": reasons,
            "max_per_hour": worst, "limits_per_hour": dict(LIMITS), "judge_min_s": JUDGE_MIN_S,
            "floor_window_s": FLOOR_WINDOW_S, "count_window_s": COUNT_WINDOW_S,
            "interval_s": _interval(samples)}


def judged_line(row: Mapping[str, Any], key: str) -> Optional[Mapping[str, float]]:
    """The line a key is judged on in one rank's row of :func:`trends`: RSS's floor, the counts' ceilings."""
    return (row.get("floor") or {}).get(key) if key in FLOOR_KEYS else (row.get("ceiling") or {}).get(key)


def _outline():
    """A thin black edge round the judged lines, so they show on top of dense samples of the same colour."""
    from matplotlib import patheffects

    return [patheffects.Stroke(linewidth=3.4, foreground="black"), patheffects.Normal()]


def _interval(samples: Sequence[Mapping[str, Any]]) -> Optional[float]:
    ts = [float(s["t"]) for s in samples]
    return float(np.median(np.diff(ts))) if len(ts) >= 3 else None


def plot(paths: Sequence[str], samples: Sequence[Mapping[str, Any]], tr: Mapping[str, Any],
         title: str) -> List[str]:
    """RSS (top), fds and threads of every rank over the run, part boundaries marked, the fitted lines
    dashed; written to every path in ``paths``. Needs matplotlib (``linkescape[plot]``)."""
    from ..common import extras

    matplotlib = extras.module("matplotlib", "plot", "the chaos report's RSS picture")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_part = series(samples)
    if not by_part:
        return []
    t_ref = min(t for ranks in by_part.values() for d in ranks.values() for t in d["t"])
    fig, axes = plt.subplots(3, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1, 1]})
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
    fits = {(p["part"], r): row for p in tr.get("parts", []) for r, row in p["ranks"].items()}
    for part, ranks in by_part.items():
        for rank, d in sorted(ranks.items()):
            c = colors[rank % len(colors)]
            x = [(t - t_ref) / 60.0 for t in d["t"]]
            for ax, k in zip(axes, KEYS):
                ax.plot(x, d[k], color=c, lw=1.0, label=f"rank {rank}" if ax is axes[0] and part ==
                        next(iter(by_part)) else None)
                row = fits.get((part, rank)) or {}
                f = judged_line(row, k)
                if f and row.get("fitted"):  # the judged line (see the module's doc)
                    xs = np.array([f["t0"], d["t"][-1]])
                    ys = f["intercept"] + f["per_hour"] * (xs - f["t0"]) / 3600.0
                    ax.plot((xs - t_ref) / 60.0, ys, color=c, lw=2.2, ls="--", zorder=5,
                            path_effects=_outline())
        first = min(t for d in ranks.values() for t in d["t"])
        if part is not None:
            pol = next((p.get("policy") for p in tr.get("parts", []) if p["part"] == part), None)
            for ax in axes:
                ax.axvline((first - t_ref) / 60.0, color="black", lw=0.8, ls=":")
            axes[0].text((first - t_ref) / 60.0, 0.98, f" part {part}: {pol or 'default'}",
                         transform=axes[0].get_xaxis_transform(), va="top", fontsize=8)
    mx = tr.get("max_per_hour") or {}
    axes[0].set_ylabel("RSS (MB)")
    axes[0].set_title(title + (f"\nlargest slope: RSS's floor {mx['rss_mb']:+.1f} MB/h, fds {mx['fds']:+.1f}/h, "
                               f"threads {mx['threads']:+.1f}/h (dashed: the judged lines, after warm-up)"
                               if mx.get("rss_mb") is not None else ""), fontsize=10)
    axes[0].legend(loc="upper left", fontsize=8, ncol=4)
    axes[1].set_ylabel("open fds")
    axes[2].set_ylabel("OS threads")
    axes[2].set_xlabel("minutes since the first sample")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    written = []
    for path in paths:
        fig.savefig(path, dpi=100)
        written.append(path)
    plt.close(fig)
    return written


__all__ = ["load", "series", "fit", "robust", "floor", "usual", "ceiling", "judged_line", "trends", "plot",
           "JUDGE_MIN_S", "RSS_LIMIT_MB_PER_H", "COUNT_LIMIT_PER_H", "COUNT_WINDOW_S"]
