"""What ``linkescape cost`` and ``linkescape simulate`` print: the inputs with their sources, each
way of meeting a fault side by side, the savings with their intervals and bands."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .baselines import SOURCES
from .model import COVERAGE, FT_GLOO_LEAVE_S, SimParams
from .sweep import flag_name

LABELS = {"restart": "restart from checkpoint", "escape": "escape (linkescape)", "nccl": "NCCL 2.30 port failover",
          "torchft": "torchft FT-HSDP", "escape_torchft": "escape + shrink/torchft"}
FT_MODES = ("torchft", "escape_torchft")


def _y(v: float) -> str:
    return f"{round(v) or 0:,.0f}"


def inputs_text(p: SimParams, log: Optional[Dict[str, Any]] = None) -> List[str]:
    ev = log["by_cause"] if log else p.events_per_run()
    src = ("in the log" if log else "Llama 3's rate, scaled" if p.interruptions is None else "--interruptions")
    pol = (f"active-backup: backups idle while healthy, {p.ab_fault_rate:.2f}x during a fault (measured)"
           if p.policy == "active-backup" else
           f"stripe: every rail while healthy, {p.stripe_fault_rate:.2f}x of that during a fault (measured)")
    wait = f"no path: wait {p.no_path_s:g} s (LINKESCAPE_NO_PATH_TIMEOUT), then fail"
    mix = (f"repairs      {p.flap_share:.0%} end by themselves (mean {p.flap_s:g} s), {p.reboot_share:.0%} with a "
           f"reboot (mean {p.reboot_s:g} s), the rest a swap (NIC {p.repair_nic_hours:g} h, host link "
           f"{p.repair_cable_hours:g} h, optic {p.repair_optic_hours:g} h, switch {p.repair_switch_hours:g} h; "
           "all assumed)")
    relay = (f"relay on: a cross runs at {p.relay_rate:.2f}x (measured, docs/failover.md)" if p.relay
             else "relay off: a cross waits for a repair")
    ck = ("Young/Daly sqrt(2 x write x MTBF " f"{p.mtbf_hours():.2f} h)" if p.checkpoint_hours is None else
          f"Young/Daly for the log's MTBF {log['mtbf_hours']:.2f} h" if log and log.get("mtbf_hours") else "given")
    fabric = ("the log says what each fault took (--coverage does not apply)" if log else
              f"{p.coverage}: {COVERAGE[p.coverage].text}"
              + (f"; plus {p.whole_host_share:.0%} of the rest take every rail" if p.whole_host_share else ""))
    return [
        f"cluster      {p.gpus:,} GPUs, {p.hosts:,} hosts x {p.rails} rails, {p.days:g}-day run, "
        f"{p.yuan_per_gpu_hour:g} yuan per GPU-hour",
        f"faults/run   {sum(ev.values()):,.1f} ({src}): NIC {ev['nic']:.1f}, switch {ev['switch']:.1f}, host link "
        f"{ev['cable']:.1f}, optic {ev['optic']:.1f}, other {ev['other']:.1f}",
        f"fabric       {fabric}",
        f"checkpoints  every {p.interval():.3f} h of progress ({ck}), write {p.checkpoint_write_s:g} s; "
        f"restart {p.restart_hours:g} h",
        f"escape       {pol}, a step {p.comm_share:.0%} network-bound; stall {p.escape_stall_ms:g} ms per fault; "
        f"{wait}; {relay}",
        ("repairs      as in the log" if log else mix),
        f"torchft      {p.ft_groups} replica groups; a group out for {p.ft_recover * 60:g} min (assumed) + rejoin "
        f"{p.ft_rejoin_s:g} s after its links return; the job stalls {p.ft_leave_s:g} s to leave a host out, in both "
        f"rows (a host cut off; rejoin and leave measured, 4 hosts: issue 47's training test), and under torchft "
        f"alone {p.ft_stall_s:g} s (torchft's timeout) for a fault of one rail",
    ]


def modes_table(modes: Dict[str, Dict[str, Any]], saved: Dict[str, Dict[str, Any]], p: SimParams,
                ci: bool = False) -> List[str]:
    scale = p.gpus * p.hours * p.yuan_per_gpu_hour
    head = f"{'':26}{'ETTR':>8}{'interruptions':>15}{'planned swaps':>15}{'yuan lost':>14}{'saved vs restart':>18}"
    lines = [head]
    for m, label in LABELS.items():
        if m not in modes:
            continue
        r = modes[m]
        sv = saved.get(m, {}).get("yuan_saved", 0.0)
        ints = "-" if m in FT_MODES else f"{r['interruptions']:.1f}"
        swaps = "-" if m in FT_MODES else f"{r.get('planned_swaps', r.get('planned_restarts', 0.0)):.1f}"
        lines.append(f"{label:26}{r['ettr']:>8.4f}{ints:>15}{swaps:>15}{_y((1 - r['ettr']) * scale):>14}{_y(sv):>18}")
        if ci and m in saved:
            lo, hi = saved[m]["yuan_saved_ci"]
            lines.append(f"{'':26}{'95 % CI of the mean: ' + _y(lo) + ' to ' + _y(hi):>70}")
    return lines


def _savings_lines(res: Dict[str, Any], p: SimParams) -> List[str]:
    e, r, s = res["escape"], res["restart"], res["saved"]["escape"]
    L = [f"network faults under restart: {res['network_interruptions']:.1f} per run x "
         f"{res['hours_per_interruption']:.3f} h (the work since the checkpoint, {r['lost_per_interruption']:.3f} h, "
         f"and the restart, {r['restart']:.3f} h) x {p.gpus:,} GPUs = {_y(res['lost_card_hours'])} GPU-hours = "
         f"{_y(res['lost_yuan'])} yuan",
         f"escape: {s['interruptions_avoided']:.1f} interruptions avoided per run, {s['planned_swaps']:.1f} planned "
         f"swaps added; {e['wait_hours']:.2f} h waited with some pair without a path; {e['degraded_hours']:.1f} h "
         "degraded",
         f"saved per run: {_y(s['yuan_saved'])} yuan; a year at this rate: {_y(res['per_year_yuan'])} yuan"]
    if res.get("short_wait_saved") is not None:
        L.append(f"  the waits are what cost: a path lost for hours is waited for {p.no_path_s:g} s; with "
                 f"--no-path-seconds {res['short_wait_s']:g} escape saves {_y(res['short_wait_saved'])} yuan per run "
                 "(`linkescape cost --break-even`)")
    band, rb = res.get("coverage_band"), res.get("rate_band")
    if band:
        L.append("  by fabric: " + ", ".join(f"{k} {_y(v)}" for k, v in band.items()) + " yuan")
    if rb:
        (nlo, nhi), (wlo, whi) = rb["nic_interval"], rb["network_interval"]
        L.append(f"  the rates' uncertainty (NIC: {rb['counts']['nic']:.0f} events, {nlo:.2f}-{nhi:.2f}x; "
                 f"switch/cable: {rb['counts']['network']:.0f}, {wlo:.2f}-{whi:.2f}x; Jeffreys 95 %): "
                 f"{_y(rb['lo'])} to {_y(rb['hi'])} yuan")
    return L


def ft_note(res: Dict[str, Any]) -> str:
    t, e = res["torchft"], res["escape_torchft"]
    extra = res["saved"]["escape_torchft"]["yuan_saved"] - res["saved"]["torchft"]["yuan_saved"]
    i = res["inputs"]
    return (f"  torchft rows: no restart; by assumption they survive every fault that takes one replica group, of any "
            f"cause, never several groups at once; groups left out per run: torchft {t.get('left_out', 0.0):.1f}, "
            f"escape + shrink/torchft {e.get('left_out', 0.0):.1f} (escape takes the faults of one rail); escape + "
            f"shrink/torchft against torchft alone: {_y(extra)} yuan per run, all from the faults of one rail"
            + (f" ({res['one_rail_faults']:.1f} per run)" if "one_rail_faults" in res else "")
            + f": escaped, where torchft alone stalls {i['ft_stall_s']:g} s and leaves a group out (both rows "
            f"leave a host out in {i['ft_leave_s']:g} s: the lighthouse's timeouts set it, Gloo's group measured "
            f"{FT_GLOO_LEAVE_S:g} s)")


def cost_text(res: Dict[str, Any], p: SimParams) -> str:
    L = ["linkescape cost: the model in closed form (the model `linkescape simulate` plays fault by fault; "
         "every input a flag)", ""] + inputs_text(p) + [""]
    L += modes_table({m: res[m] for m in LABELS}, res["saved"], p)
    L += [f"  NCCL: only between ports merged into a virtual NIC (here {p.nccl_merged_share:.0%} of the hosts; "
          "one NIC per GPU, as Llama 3, has none)", ft_note(res)]
    L += [""]
    L += _savings_lines(res, p)
    L += ["", "This counts what escape saves against a restart from checkpoint on the faults it survives, and what "
          "it costs on those it does not (waits, stalls, slower rails, planned swaps). Check it with `linkescape "
          "simulate` (same inputs, paired Monte Carlo, 95 % intervals); sources: docs/operations.md."]
    return "\n".join(L) + "\n"


def seed_text(seed: Dict[str, Any], model: Dict[str, Any], p: SimParams) -> str:
    i, net = seed["inputs"], seed["network_interruptions"]
    L = ["The seed article's calculation (scenario seed-article), as it makes it:",
         f"network interruptions = {i['interruptions']:g} interruptions x {i['network_share']:g} network share = "
         f"{net:,.3f}",
         f"lost card-hours       = {net:,.3f} x {i['cards']:,.0f} cards x {i['recovery_hours']:g} h recovery = "
         f"{_y(seed['lost_card_hours'])}",
         f"lost per run          = {_y(seed['lost_card_hours'])} card-hours x {i['yuan_per_card_hour']:g} yuan = "
         f"{_y(seed['lost_yuan'])} yuan (a {i['days']:g}-day run)",
         f"per year              = {_y(seed['lost_yuan'])} yuan x 365 / {i['days']:g} days = "
         f"{_y(seed['per_year_yuan'])} yuan",
         "", "Inputs that contradict the source (Llama 3, 'The Llama 3 Herd of Models', 2024, section 3.3.4, "
         "table 5):"]
    L += [f"- {c['input']}: {c['why']}" for c in seed["contradictions"]]
    s = model["saved"]["escape"]
    band = model.get("coverage_band")
    L += ["", f"The same question with sourced inputs (`linkescape cost`, fabric {p.coverage}): network faults cost "
              f"{_y(model['lost_yuan'])} yuan per run under restart; escape saves {_y(s['yuan_saved'])} yuan per run"
              + (" (by fabric: " + ", ".join(f"{k} {_y(v)}" for k, v in band.items()) + ")" if band else "") + "."]
    return "\n".join(L) + "\n"


def _simulate_result_lines(res: Dict[str, Any], cf: Dict[str, Any]) -> List[str]:
    e, s = res["escape"], res["saved"]["escape"]
    by = e["interruptions_by_cause"]
    L = [f"escape: {e['escaped']:.1f} faults escaped and {e['absorbed']:.1f} absorbed in a restart per run; "
         f"interruptions avoided {s['interruptions_avoided']:.1f}, planned swaps added {s['planned_swaps']:.1f}; "
         f"left: other {by['other']:.1f}, a host with no rail {by['isolated']:.2f}, a cross {by['cross']:.2f}; "
         f"{e['wait_hours']:.2f} h waited without a path, {e['degraded_hours']:.1f} h degraded, "
         f"{e['relayed_hours']:.1f} h relayed"]
    c = cf["saved"]["escape"]["yuan_saved"]
    if res.get("replay"):
        L.append(f"saved: {_y(s['yuan_saved'])} yuan over the log (one schedule: no sampling interval); the closed "
                 f"form at the log's rates: {_y(c)} (what a run with these rates saves on average)")
        return L
    lo, hi = s["yuan_saved_ci"]
    g = s["ettr_gain_ci"]
    L += [f"saved per run: {_y(s['yuan_saved'])} yuan, 95 % CI {_y(lo)} to {_y(hi)} (one run's sd "
          f"{_y(s['yuan_saved_run_sd'])}); closed form (`linkescape cost`, same inputs): {_y(c)}, "
          f"{'inside' if lo <= c <= hi else 'OUTSIDE'} the interval",
          f"ETTR gain: {s['ettr_gain']:+.5f} (95 % CI {g[0]:+.5f} to {g[1]:+.5f})"]
    return L


def simulate_text(res: Dict[str, Any], p: SimParams, cf: Dict[str, Any]) -> str:
    fk = res["faults_per_run"]
    what = (f"replay of {res['log']['path']} ({res['log']['rows']} faults)" if res.get("replay")
            else f"{res['trials']} trials (seed {p.seed}), paired: every mode on the same faults")
    L = [f"linkescape simulate: {what}"] + inputs_text(p, res.get("log"))
    if not res.get("replay"):
        L.append(f"faults/run   drawn: NIC {fk['nic']:.1f}, switch {fk['switch']:.1f}, host link {fk['cable']:.1f}, "
                 f"optic {fk['optic']:.1f} (every rail: {fk['whole_host']:.1f}), other {fk['other']:.1f}")
    L.append("")
    L += modes_table({m: res[m] for m in LABELS if m in res}, res["saved"], p, ci=not res.get("replay"))
    if "torchft" in res:
        L.append(ft_note(res))
    L.append("")
    L += _simulate_result_lines(res, cf)
    return "\n".join(L) + "\n"


def sweep_text(rows: List[Dict[str, Any]]) -> str:
    name = flag_name(rows[0]["param"])
    L = [f"{name:>18}{'ckpt h':>8}{'ETTR restart':>13}{'escape':>8}{'saved: closed form':>19}{'simulated':>12}"
         f"{'95 % CI':>25}{'avoided':>8}{'swaps':>6}{'NCCL saves':>12}"]
    for r in rows:
        v = str(r["value"]) if isinstance(r["value"], (str, bool)) else f"{r['value']:g}"
        lo, hi = r["saved_ci"]
        ci = "-" if r["trials"] < 2 else f"{_y(lo)}..{_y(hi)}"
        L.append(f"{v:>18}{r['checkpoint_hours']:>8.3f}{r['ettr_restart']:>13.4f}{r['ettr_escape']:>8.4f}"
                 f"{_y(r['closed_form']):>19}{_y(r['saved']):>12}{ci:>25}{r['interruptions_avoided']:>8.1f}"
                 f"{r['planned_swaps']:>6.1f}{_y(r['nccl_saved']):>12}")
    return "\n".join(L) + "\n"


def sources_text() -> str:
    return "\n".join(f"{LABELS[k]}: {v}" for k, v in SOURCES.items()) + "\n"


__all__ = ["cost_text", "seed_text", "simulate_text", "sweep_text", "inputs_text", "sources_text", "ft_note", "LABELS"]
