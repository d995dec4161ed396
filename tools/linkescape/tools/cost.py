"""``linkescape cost``: the cost model in closed form, and the seed article's calculation.

The model is the one ``linkescape simulate`` plays fault by fault (:mod:`.simulate`), on the
same inputs (:mod:`.model`); here it is taken in expectation:

- A job interrupted at rate ``L`` per hour is a renewal process: up for Exp(L) hours, progress
  at ``eff = tau / (tau + delta)`` per hour, a loss of the progress since the last checkpoint,
  ``E[X mod tau]`` with X ~ Exp(L / eff), then a restart of R hours that any further fault
  starts again, ``(e^(L' R) - 1) / L'``. ETTR = (eff / L (1 - u) - E[X mod tau]) / (1 / L + restart),
  with ``u`` the share of an up-hour's progress lost to what is not an interruption.
- Under escape, a fault of one rail is no interruption: it costs its failover stall and the share
  of the time some host is degraded (or a planned swap at the next checkpoint); it leads to one,
  after the no-path wait, when the host loses its last rail or two hosts lose complementary rails
  before a repair (first order in the rates: window x rate of the fault that completes it). Waits
  end early when another cause interrupts the job; the waiting hours are ``u`` too.

``seed_article`` is the seed's own arithmetic (3,519,600 yuan) with what in it contradicts its source.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, List

from .baselines import MODES, Mode, expected_degraded_hours, interrupt_rate, modes, one_rail_rate
from .model import (CAUSES, COVERAGE, LLAMA3_DAYS, LLAMA3_ETTR, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS,
                    LLAMA3_NETWORK_SHARE, LLAMA3_NIC_SHARE, SimParams)
from .stats import rate_interval


def renewal_ettr(lam: float, lam_restart: float, eff: float, tau: float, restart: float,
                 extra_down: float = 0.0, up_loss: float = 0.0) -> Dict[str, float]:
    """ETTR of a job interrupted at ``lam`` per hour, its restarts started again at ``lam_restart``
    (see the module's text); ``extra_down``: more hours without progress per interruption (the
    planned swaps' restarts), ``up_loss``: the share of an up-hour's progress lost otherwise."""
    down = math.expm1(lam_restart * restart) / lam_restart if lam_restart > 0 else restart
    if lam <= 0:
        return {"ettr": eff * (1.0 - up_loss), "lost_per_interruption": 0.0, "restart": down}
    mu = lam / eff
    lost = 1.0 / mu - tau / math.expm1(mu * tau) if mu * tau > 1e-9 else tau / 2
    up = 1.0 / lam
    ettr = (eff * up * (1.0 - up_loss) - lost) / (up + extra_down + down)
    return {"ettr": ettr, "lost_per_interruption": lost, "restart": down}


def _block(w: float, rep: float, lam: float, residual: bool, expo: bool = False) -> Dict[str, float]:
    """Some pair without a path: a repair gives it back after ``rep`` hours (``residual``: after the
    rest of another fault's repair, Uniform(0, rep); ``expo``: after an exponential time of mean
    ``rep``, its own rest too), the job gives up after ``w``, and an interruption of another cause
    (``lam`` per hour) ends it sooner. The probability that the wait runs out, and the expected wait."""
    if expo:
        if rep <= 0 or w <= 0:
            return {"fail": 0.0 if rep <= 0 else 1.0, "wait": 0.0}
        k = 1.0 / rep + lam
        return {"fail": math.exp(-k * w), "wait": -math.expm1(-k * w) / k}
    end = min(w, rep)
    if rep <= 0 or end <= 0:
        return {"fail": 1.0 if rep > w else 0.0, "wait": 0.0}
    if not residual:
        wait = -math.expm1(-lam * end) / lam if lam > 0 else end
        return {"fail": math.exp(-lam * w) if w < rep else 0.0, "wait": wait}
    if lam > 0:  # integral of (1 - t / rep) e^(-lam t) over [0, end]
        e = math.exp(-lam * end)
        wait = (1 - e) / lam - (1 - e * (1 + lam * end)) / (lam * lam * rep)
    else:
        wait = end - end * end / (2 * rep)
    return {"fail": (1 - w / rep) * math.exp(-lam * w) if w < rep else 0.0, "wait": wait}


def _window(rep: float, expo: bool, lam: float) -> float:
    """How long a fault's effect is expected to last: until its repair, or an interruption (``lam``)."""
    if expo:
        return 0.0 if rep <= 0 else 1.0 / (1.0 / rep + lam)
    return expected_degraded_hours(rep, lam)


def _ft_leave_cost(p: SimParams, m: Mode) -> float:
    """Hours of the whole job that leaving one replica group out costs under torchft."""
    return m.leave_h + m.out_h / p.ft_groups


def _degraded(p: SimParams, m: Mode, window: float, lam_i: float, tau: float, eff: float) -> Dict[str, float]:
    """One escaped fault: the hours it leaves a host degraded, and whether it is drained (swapped
    at the next checkpoint, unless an interruption of another cause replaces the host first)."""
    s = p.job_speed(m.rate(1))
    if m.ft:  # torchft: leave the host's group out at once when that costs less than running slower
        leave = p.drain and s < 1.0 and window * (1.0 - s) > _ft_leave_cost(p, m)
        return {"window": 0.0 if leave else window, "drain": 1.0 if leave else 0.0, "speed": s}
    if p.drain and s < 1.0 and window * (1.0 - s) > p.restart_hours:
        to_ckpt = tau / (2 * s * eff)
        return {"window": expected_degraded_hours(to_ckpt, lam_i), "drain": math.exp(-lam_i * to_ckpt), "speed": s}
    return {"window": window, "drain": 0.0, "speed": s}


def _degraded_share(windows: List, lam: float, down: float, steps: int = 400) -> float:
    """Share of the up time with some host degraded, when faults of one rail come at ``e`` per
    up-hour and last ``rep`` hours (``windows``: (e, rep) pairs), every interruption (``lam`` per
    up-hour) ends them all, and those of the last ``down`` hours of a restart come up with it. At an up
    moment of age A (since the restart, Exp(lam)), no host is degraded with probability
    prod exp(-e (min(rep, A) + down [A < rep])); the share is one minus its mean over A."""
    if not windows:
        return 0.0
    top = max(rep for _, rep in windows)

    def none(age: float) -> float:
        return math.exp(-sum(e * (min(rep, age) + (down if age < rep else 0.0)) for e, rep in windows))

    if lam <= 0:
        return 1.0 - none(top)
    h = top / steps
    inside = sum(lam * math.exp(-lam * (i + 0.5) * h) * none((i + 0.5) * h) for i in range(steps)) * h
    return 1.0 - inside - math.exp(-lam * top) * none(top)


def _relayed(p: SimParams, m: Mode, a: Dict[str, Any], rate: float, rep: float, expo: bool, lam_i: float,
             tau: float, eff: float) -> None:
    """Crosses carried by the relay: at the relayed rate until the first repair (the rest of the first
    fault's, Uniform(0, rep)), or swapped at the next checkpoint when that costs less."""
    s = p.job_speed(m.relay_rate)
    if m.ft:
        if p.drain and s < 1.0 and _window(rep, expo, lam_i) * (1.0 - s) > _ft_leave_cost(p, m):
            a["drains"] += rate
        else:
            a["relay"] += rate * _window(rep, expo, lam_i)
        return
    if p.drain and s < 1.0 and _window(rep, expo, lam_i) * (1.0 - s) > p.restart_hours:
        a["drains"] += rate
        a["relay"] += rate * expected_degraded_hours(tau / (2 * s * eff), lam_i)
    else:
        a["relay"] += rate * (_window(rep, expo, lam_i) if expo else _block(rep, rep, lam_i, residual=True)["wait"])


def _partners(p: SimParams, m: Mode) -> int:
    """Rails of another host whose loss, with one rail lost here, leaves the pair without a path."""
    if m.name == "nccl":
        return p.nccl_ports - 1
    return 1 if p.rails == 2 else 0


def _whole_host(p: SimParams, m: Mode, a: Dict[str, float], cov: float) -> None:
    """Faults that take every rail (or that the mode does not cover): an interruption now, or a wait."""
    for c in CAUSES:
        ev = p.events_per_hour(c)
        whole = ev * (1.0 if p.fabric.scope(c) == "host" else p.whole_host_share)
        now = ev * (1 - cov)
        lam = a["lam_now"] + now
        blk = {"fail": 0.0, "wait": 0.0}
        for share, rep, expo in p.repair_mix(c):
            b = _block(m.wait_h, rep, lam, residual=False, expo=expo)
            blk = {k: blk[k] + share * b[k] for k in blk}
        a["lam_now"] += now
        a["lam_reset"] += now + whole * cov
        a["lam"] += now + whole * cov * blk["fail"]
        a["blocked_fail"] += whole * cov * blk["fail"]
        a["wait"] += whole * cov * blk["wait"]


def _escape_rates(p: SimParams, m: Mode) -> Dict[str, float]:
    """Per up-hour under an escaping mode: interruptions (``lam``; ``lam_now``: those with no wait;
    ``lam_reset``: the faults that start a restart again), escaped faults, and what they cost:
    stalls, degraded hours, drains, waits, relayed time."""
    tau, eff, cov = p.interval(), p.checkpoint_efficiency(), m.covered_hosts / p.hosts
    lam_i = interrupt_rate(p, m)
    rail = {c: p.events_per_hour(c) * (1 - p.whole_host_share) * cov for c in CAUSES if p.fabric.scope(c) == "rail"}
    total_rail = sum(rail.values())
    per_host_rail = sum(v * (p.span if c == "switch" else 1) for c, v in rail.items()) / (p.hosts * p.rails)
    other = p.events_per_hour("other")
    a = {"lam": other, "lam_now": other, "lam_reset": other, "blocked_fail": 0.0, "escaped": 0.0, "stall": 0.0,
         "windows": [], "drains": 0.0, "drain_hours": 0.0, "wait": 0.0, "relay": 0.0, "rail": total_rail, "speed": 1.0}
    _whole_host(p, m, a, cov)
    for c, e_all in rail.items():
        for share, rep, expo in p.repair_mix(c):
            e = e_all * share
            d = _degraded(p, m, _window(rep, expo, lam_i), lam_i, tau, eff)
            a["speed"] = d["speed"]
            k = m.max_lost
            p_iso = (p.span if c == "switch" else 1) * math.comb(p.rails - 1, k) * (per_host_rail * d["window"]) ** k
            p_cross = _partners(p, m) / p.rails * total_rail * d["window"]
            blocked = e * (p_iso + (0.0 if m.relay else p_cross))
            sev = _block(m.wait_h, rep, lam_i, residual=True, expo=expo)
            a["lam"] += blocked * sev["fail"]
            a["blocked_fail"] += blocked * sev["fail"]
            a["wait"] += blocked * sev["wait"]
            if m.relay:
                _relayed(p, m, a, e * p_cross, rep, expo, lam_i, tau, eff)
            a["escaped"] += e - blocked
            a["stall"] += e * m.stall_h * d["speed"]
            a["drains"] += e * d["drain"]
            if d["drain"]:
                a["drain_hours"] += e * d["window"]
            elif d["speed"] < 1.0:
                a["windows"].append((e, rep))
    return a


def ft_ettr(p: SimParams, m: Mode) -> Dict[str, Any]:
    """A torchft mode in expectation: no restart; each fault it does not escape stalls the job for
    ``leave_h`` (``rail_leave_h`` for a fault of one rail) and keeps one of the replica groups out for
    ``out_h`` after that; the checkpoint writes are kept as for restart (an upper bound: torchft needs
    them only for what takes every group)."""
    T, eff, G = p.hours, p.checkpoint_efficiency(), p.ft_groups
    per = m.out_h / G + m.leave_h
    if not m.escapes:
        lam = sum(p.events_per_hour(c) for c in (*CAUSES, "other"))
        up_loss = escaped = degraded = relayed = 0.0
        # a fault of one rail stalls the job torchft's timeout (rail_leave_h) instead of the leave time
        per += one_rail_rate(p) * (m.rail_leave_h - m.leave_h) / lam if lam > 0 else 0.0
    else:
        a = _escape_rates(p, m)
        # a host slowed (or relayed) for longer than a group out would cost is left out at once
        lam, s, escaped = a["lam"] + a["drains"], a["speed"], a["escaped"]
        degraded = _degraded_share(a["windows"], 0.0, 0.0)
        relayed = a["relay"]
        up_loss = a["stall"] + (1 - s) * degraded + relayed * (1 - p.job_speed(m.relay_rate))
    ettr = eff * max(0.0, 1.0 - lam * per - up_loss)
    return {"ettr": ettr, "interruptions": 0.0, "left_out": lam * T, "hours_per_fault": per, "planned_swaps": 0.0,
            "escaped": escaped * T, "wait_hours": 0.0, "degraded_hours": degraded * T, "relayed_hours": relayed * T,
            "group_gpus": p.gpus / G}


def mode_ettr(p: SimParams, m: Mode) -> Dict[str, Any]:
    """One mode in expectation: ETTR, interruptions and what made them, per run."""
    T, tau, eff = p.hours, p.interval(), p.checkpoint_efficiency()
    if m.ft:
        return ft_ettr(p, m)
    if not m.escapes:
        lam = sum(p.events_per_hour(c) for c in (*CAUSES, "other"))
        r = renewal_ettr(lam, lam, eff, tau, p.restart_hours)
        return {**r, "interruptions": T * lam / (1 + lam * r["restart"]), "planned_swaps": 0.0, "escaped": 0.0,
                "wait_hours": 0.0, "degraded_hours": 0.0}
    a = _escape_rates(p, m)
    # a fault that leaves a pair without a path while the job already waits for one starts no wait of its own
    a["lam"] -= a["blocked_fail"] * a["wait"] / (1 + a["wait"])
    a["wait"] /= 1 + a["wait"]
    lam, lam_reset, s = a["lam"], a["lam_reset"], a["speed"]
    down = math.expm1(lam_reset * p.restart_hours) / lam_reset if lam_reset > 0 else p.restart_hours
    # faults of one rail in the last, successful stretch of a restart are absorbed: the host comes up
    # degraded (and is drained)
    absorbed = 1.0
    for _ in range(4):
        absorbed = 1.0 + (lam + a["drains"] * absorbed) * p.restart_hours
    drains = a["drains"] * absorbed
    degraded = _degraded_share(a["windows"], lam, p.restart_hours) + a["drain_hours"] * absorbed
    # progress lost per up-hour, as a share of what the hour would have made
    up_loss = a["stall"] + a["wait"] + (1 - s) * degraded + a["relay"] * (1 - p.job_speed(m.relay_rate))
    if lam > 0:
        r = renewal_ettr(lam, lam_reset, eff, tau, p.restart_hours, extra_down=drains / lam * down,
                         up_loss=up_loss)
    else:
        r = {"ettr": eff * (1 - up_loss) / (1 + drains * down), "lost_per_interruption": 0.0, "restart": down}
    cycles = T / (1 + (lam + drains) * down)  # up-hours in the run
    return {**r, "interruptions": lam * cycles, "planned_swaps": drains * cycles, "escaped": a["escaped"] * cycles,
            "wait_hours": a["wait"] * cycles, "degraded_hours": degraded * cycles * (s < 1.0),
            "relayed_hours": a["relay"] * cycles}


def closed_form(p: SimParams) -> Dict[str, Any]:
    """Every mode in expectation, and what escape (and NCCL's failover) save against restart."""
    ms = modes(p)
    out: Dict[str, Any] = {m: mode_ettr(p, ms[m]) for m in MODES}
    scale = p.gpus * p.hours * p.yuan_per_gpu_hour
    r = out["restart"]
    out["saved"] = {m: {"ettr_gain": out[m]["ettr"] - r["ettr"], "yuan_saved": (out[m]["ettr"] - r["ettr"]) * scale,
                        "interruptions_avoided": r["interruptions"] - out[m]["interruptions"],
                        "planned_swaps": out[m].get("planned_swaps", 0.0)}
                    for m in MODES if m != "restart"}
    return out


def savings(p: SimParams, mode: str = "escape") -> float:
    return closed_form(p)["saved"][mode]["yuan_saved"]


#: the no-path waits an operator would set, in seconds (``linkescape cost --break-even``)
WAITS = (0, 10, 30, 60, 90, 120, 180, 300, 600, 900, 1800, 3600)


def best_wait(p: SimParams, waits=WAITS) -> float:
    """The wait (of ``waits``, seconds) at which escape saves most."""
    return float(max(waits, key=lambda w: savings(replace(p, no_path_s=float(w)))))


def coverage_band(p: SimParams) -> Dict[str, float]:
    return {name: savings(replace(p, coverage=name)) for name in COVERAGE}


def _scaled(p: SimParams, nic: float, net: float, other: float) -> SimParams:
    return replace(p, nic_per_day=p.rate("nic") * nic, cable_per_day=p.rate("cable") * net,
                   optic_per_day=p.rate("optic") * net, switch_per_day=p.rate("switch") * net,
                   other_per_gpu_day=p.rate("other") * other)


def rate_band(p: SimParams, draws: int = 400, seed: int = 0) -> Dict[str, Any]:
    """The savings when the rates are as uncertain as the counts they come from (Jeffreys
    posteriors of the NIC, switch/cable and other counts): the 2.5 and 97.5 percentiles."""
    import numpy as np

    counts = p.source_counts()
    rng = np.random.default_rng(seed)
    given = {"nic": p.nic_per_day is not None, "network": p.cable_per_day is not None}
    mult = {k: (np.full(draws, 1.0) if given.get(k) or n <= 0 else rng.gamma(n + 0.5, 1.0 / n, draws))
            for k, n in counts.items()}
    vals = sorted(savings(_scaled(p, mult["nic"][i], mult["network"][i], mult["other"][i])) for i in range(draws))
    lo, hi = vals[int(0.025 * (draws - 1))], vals[int(math.ceil(0.975 * (draws - 1)))]
    return {"lo": lo, "hi": hi, "draws": draws, "counts": counts,
            "nic_interval": rate_interval(counts["nic"]), "network_interval": rate_interval(counts["network"]),
            "nic_low": savings(_scaled(p, rate_interval(counts["nic"])[0], 1, 1)),
            "nic_high": savings(_scaled(p, rate_interval(counts["nic"])[1], 1, 1))}


def compute(p: SimParams, bands: bool = True) -> Dict[str, Any]:
    """What ``linkescape cost`` reports: the closed form, the coverage band and the rates' band."""
    cf = closed_form(p)
    out = {"inputs": p.as_dict(), "resolved": p.resolved(), **cf}
    r = cf["restart"]
    net_events = sum(p.events_per_run()[c] for c in CAUSES)
    per_int = r["lost_per_interruption"] + r["restart"]
    out["network_interruptions"] = net_events
    out["hours_per_interruption"] = per_int
    out["lost_card_hours"] = net_events * per_int * p.gpus
    out["lost_yuan"] = out["lost_card_hours"] * p.yuan_per_gpu_hour
    out["yuan_saved"] = cf["saved"]["escape"]["yuan_saved"]
    # what escape adds to torchft: both rows leave a host out in ft_leave_s, so it comes from the faults
    # of one rail, which escape survives and which stall torchft alone for its timeout
    sv = cf["saved"]
    out["escape_torchft_adds"] = sv["escape_torchft"]["yuan_saved"] - sv["torchft"]["yuan_saved"]
    out["one_rail_faults"] = one_rail_rate(p) * p.hours
    out["per_year_yuan"] = out["yuan_saved"] * 365.0 / p.days
    best = best_wait(p)
    out["short_wait_s"] = best
    out["short_wait_saved"] = (savings(replace(p, no_path_s=best))
                               if cf["escape"]["wait_hours"] > 0.1 and p.no_path_s > best else None)
    if bands:
        out["coverage_band"] = coverage_band(p)
        out["rate_band"] = rate_band(p, seed=p.seed)
    return out


# ------------------------------------------------------------------ the seed article
SEED = {"interruptions": 419, "days": 54, "network_share": 0.084, "cards": 10000, "yuan_per_card_hour": 10,
        "recovery_hours": 1}


def seed_article(**override: float) -> Dict[str, Any]:
    """The seed's arithmetic: 419 x 8.4 % x 10,000 cards x 1 h x 10 yuan = 3,519,600 yuan;
    and which of its inputs contradict the source they come from."""
    i = {**SEED, **override}
    network = i["interruptions"] * i["network_share"]
    card_hours = network * i["cards"] * i["recovery_hours"]
    yuan = card_hours * i["yuan_per_card_hour"]
    hours = i["days"] * 24
    bound = (1 - LLAMA3_ETTR) * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS
    found: List[Dict[str, str]] = []
    if i["recovery_hours"] > bound:
        found.append({"input": "recovery_hours", "why": (
            f"{i['recovery_hours']:g} h per interruption: {i['interruptions']:g} x {i['recovery_hours']:g} h is "
            f"{i['interruptions'] * i['recovery_hours'] / hours:.0%} of the run's {hours:,.0f} h, so ETTR would be "
            f"at most {1 - i['interruptions'] * i['recovery_hours'] / hours:.0%}; the same report gives > 90 % "
            f"effective training time, which allows at most {bound:.2f} h per interruption")})
    if i["interruptions"] == LLAMA3_INTERRUPTIONS and i["cards"] != LLAMA3_GPUS:
        found.append({"input": "cards", "why": (
            f"the 419 interruptions were seen on {LLAMA3_GPUS:,} GPUs; at the same rate {i['cards']:,.0f} cards see "
            f"{LLAMA3_INTERRUPTIONS * i['cards'] / LLAMA3_GPUS:.0f} in {LLAMA3_DAYS:g} days, so the seed counts "
            f"{LLAMA3_GPUS / i['cards']:.2f}x too many for its cluster")})
    if i["network_share"] == LLAMA3_NETWORK_SHARE:
        found.append({"input": "network_share", "why": (
            "8.4 % is 'faulty network switch/cable' (the seed reads it as cables and NIC optics): it counts "
            "switches, which a host-side escape cannot survive where one switch carries every rail of a host "
            "(Llama 3: one top-of-rack switch per rack), and "
            f"it leaves out the {LLAMA3_NIC_SHARE:.1%} 'faulty network interface card' that escape does survive")})
    found.append({"input": "per_year", "why": (
        "'more than ten million yuan a year' assumes every network interruption is escaped whole, at 1 h "
        "each: the coverage (which faults take only one rail) and the cost of what escape cannot avoid are "
        "left out")})
    return {"inputs": i, "network_interruptions": round(network, 6), "lost_card_hours": round(card_hours, 6),
            "lost_yuan": round(yuan, 2), "per_year_yuan": round(yuan * 365.0 / i["days"], 2),
            "ettr_bound_hours": bound, "contradictions": found}


__all__ = ["WAITS", "best_wait", "ft_ettr", "renewal_ettr", "mode_ettr", "closed_form", "savings", "coverage_band",
           "rate_band", "compute",
           "seed_article", "SEED"]
