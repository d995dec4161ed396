"""``--sweep PARAM=a:b[:n]``: the savings across one input, closed form and Monte Carlo side by side.

``PARAM`` is any input by its flag name (``checkpoint-hours``, ``restart-hours``, ``comm-share``,
``switch-share``, ``gpus``, ``no-path-seconds``, ...) or an alias (``interval``, ``restart``,
``network-share-of-step``). ``a:b:n``: n values from a to b (5 by default); ``gpus`` goes
geometrically. ``coverage`` takes preset names instead, ``coverage=all`` or
``coverage=rail-optimized:tor``; ``policy`` and ``relay`` alike.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..common.errors import UsageError
from .cost import closed_form
from .failures import Failure
from .model import COVERAGE, POLICIES, SimParams
from .simulate import simulate

#: flag names (without --) of inputs whose field is named differently
FLAG_FIELDS = {"nic-rate": "nic_per_day", "cable-rate": "cable_per_day", "optic-rate": "optic_per_day",
               "switch-rate": "switch_per_day", "other-rate": "other_per_gpu_day",
               "checkpoint-write-seconds": "checkpoint_write_s", "no-path-seconds": "no_path_s",
               "nccl-detect-seconds": "nccl_detect_s", "ft-stall-seconds": "ft_stall_s", "flap-seconds": "flap_s",
               "reboot-seconds": "reboot_s", "ft-leave-seconds": "ft_leave_s", "ft-rejoin-seconds": "ft_rejoin_s",
               "cards": "gpus", "recovery-hours": "restart_hours", "yuan-per-card-hour": "yuan_per_gpu_hour"}
ALIASES = {"interval": "checkpoint_hours", "checkpoint-interval": "checkpoint_hours", "checkpoint": "checkpoint_hours",
           "restart": "restart_hours", "restart-time": "restart_hours", "fabric": "coverage",
           "network-share-of-step": "comm_share", "step-network-share": "comm_share", "comm": "comm_share",
           "write": "checkpoint_write_s", "no-path": "no_path_s"}
_ALIAS_FLAGS = ("cards", "recovery-hours", "yuan-per-card-hour")
CHOICES = {"coverage": tuple(COVERAGE), "policy": POLICIES, "relay": (False, True), "drain": (False, True)}
NOT_SWEPT = {"trials", "seed"}


def flag_name(f: str) -> str:
    """The flag an input is given by (``no_path_s`` -> ``no-path-seconds``)."""
    back = {v: k for k, v in FLAG_FIELDS.items() if k not in _ALIAS_FLAGS}
    return back.get(f, f.replace("_", "-"))


def field_of(name: str) -> str:
    key = name.strip().lower().lstrip("-").replace("_", "-")
    f = ALIASES.get(key) or FLAG_FIELDS.get(key) or key.replace("-", "_")
    if f not in {x.name for x in fields(SimParams)} or f in NOT_SWEPT:
        raise UsageError(f"--sweep: no input named {name!r} (e.g. checkpoint-hours, coverage, restart-hours, "
                         "comm-share, switch-share, gpus, no-path-seconds)")
    return f


def _choice(f: str, text: str) -> List[Any]:
    options = CHOICES[f]
    parts = [x for x in text.replace(",", ":").split(":") if x]
    if parts == ["all"] or not parts:
        return list(options)
    out = []
    for x in parts:
        v = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}.get(x.lower(), x)
        if v not in options:
            raise UsageError(f"--sweep {f.replace('_', '-')}: {x!r} is not one of {', '.join(map(str, options))}")
        out.append(v)
    return out


def parse(spec: str) -> Tuple[str, List[Any]]:
    """``PARAM=a:b[:n]`` -> (field, values)."""
    if "=" not in spec:
        raise UsageError(f"--sweep {spec!r}: expected PARAM=a:b[:n], e.g. checkpoint-hours=0.05:1:8")
    name, rng = spec.split("=", 1)
    f = field_of(name)
    if f in CHOICES:
        return f, _choice(f, rng)
    parts = rng.split(":")
    try:
        nums = [float(x) for x in parts]
    except ValueError:
        raise UsageError(f"--sweep {spec!r}: a, b and n must be numbers") from None
    if len(nums) not in (2, 3) or (len(nums) == 3 and (nums[2] < 1 or nums[2] != int(nums[2]))):
        raise UsageError(f"--sweep {spec!r}: expected PARAM=a:b[:n] with n a positive integer")
    a, b = nums[0], nums[1]
    n = int(nums[2]) if len(nums) == 3 else 5
    if n == 1:
        vals = [a]
    elif f == "gpus" and a > 0 and b > 0:
        vals = [a * (b / a) ** (i / (n - 1)) for i in range(n)]
    else:
        vals = [a + (b - a) * i / (n - 1) for i in range(n)]
    ints = {x.name for x in fields(SimParams) if x.type in ("int", "Optional[int]")}
    if f in ints:
        vals = sorted({int(round(v)) for v in vals})
    return f, vals


def run(p: SimParams, f: str, values: Sequence[Any], faults: Optional[Sequence[Failure]] = None) -> List[Dict[str, Any]]:
    """One row per value: the closed form's and the Monte Carlo's (or the replay's) savings."""
    rows = []
    for v in values:
        q = replace(p, **{f: v})
        cf = closed_form(q)
        mc = simulate(q, faults)
        rows.append({"param": f, "value": v, "checkpoint_hours": q.interval(),
                     "closed_form": cf["saved"]["escape"]["yuan_saved"],
                     "saved": mc["saved"]["escape"]["yuan_saved"], "saved_ci": mc["saved"]["escape"]["yuan_saved_ci"],
                     "ettr_restart": mc["restart"]["ettr"], "ettr_escape": mc["escape"]["ettr"],
                     "interruptions_avoided": mc["saved"]["escape"]["interruptions_avoided"],
                     "planned_swaps": mc["saved"]["escape"]["planned_swaps"],
                     "nccl_saved": mc["saved"]["nccl"]["yuan_saved"], "trials": mc["trials"]})
    return rows


def sizes(p: SimParams, values: Sequence[int], coverages: Sequence[str] = tuple(COVERAGE)) -> Dict[str, List[Dict]]:
    """The savings against cluster size, for each fabric preset (what ``simulate --plot`` draws)."""
    return {c: run(replace(p, coverage=c), "gpus", values) for c in coverages}


__all__ = ["parse", "run", "sizes", "field_of", "flag_name", "FLAG_FIELDS", "ALIASES"]
