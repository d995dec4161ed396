"""The failover benchmark from start to end: a testbed, the fault series, overhead, MPTCP, rate phases.

:func:`run_failover_bench` (``linkescape bench --faults KINDS``) and
:func:`run_rate_bench` (``... --rate-phases``) return the result dict (also
written as JSON); :func:`.report.format_report` prints it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from .analysis import analyze_series
from .compare import run_mptcp_comparison
from .report import verdict
from .series import namespace_congestion, run_fault_series, run_overhead
from .settings import (DEFAULT_FAULTS, FAULT_KINDS, POLICIES, RATE_FAULT_KINDS, TARGETS, Log, PhaseSettings,
                       Settings, cc_env, policy_env)


def _check(faults: Sequence[str], hosts: int, rails: int, allowed: Tuple[str, ...] = FAULT_KINDS) -> Tuple[str, ...]:
    from ...testbed.netns import require_root

    kinds = tuple(faults)
    for k in kinds:
        if k not in allowed:
            raise ValueError(f"unknown fault kind {k!r}; expected some of {allowed}"
                             + (" (cross: with --rate-phases)" if k == "cross" else ""))
    if not kinds:
        raise ValueError(f"no fault kinds; expected some of {allowed}")
    if "cross" in kinds and hosts < 3:
        raise ValueError("a cross needs at least 3 hosts: two that share no rail, and one to relay")
    if rails < 2:
        raise ValueError("the failover benchmark needs at least 2 rails")
    if hosts < 2:
        raise ValueError("the failover benchmark needs at least 2 hosts")
    require_root("the failover benchmark")
    if "blackhole" in kinds:
        from ...testbed.netns import require_nft

        require_nft()
    return kinds


def _policy(policy: Optional[str]) -> Optional[str]:
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
    return policy


def _result(settings: Dict[str, Any], t_start: float) -> Dict[str, Any]:
    return {"bench": "failover", "settings": dict(settings), "command": None, "host": platform.node(),
            "kernel": platform.release(), "cpus": os.cpu_count(), "started": t_start, "targets": TARGETS,
            "series": {}, "overhead": None, "mptcp": None, "rates": None}


def _finish(result: Dict[str, Any], t_start: float, json_path: Optional[str]) -> Dict[str, Any]:
    """A run's duration and verdict; written to ``json_path`` too."""
    result["duration_s"] = time.time() - t_start
    result["verdict"] = verdict(result)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return result


def run_failover_bench(faults: Sequence[str] = DEFAULT_FAULTS, count: int = 20, hosts: int = 4, rails: int = 2,
                       rate: str = "1gbit", size: int = 16 << 20, json_path: Optional[str] = None,
                       log: Optional[Log] = None, **options: Any) -> dict:
    """Run the failover benchmark; returns the result dict (also written to ``json_path``).

    ``options`` are other :class:`Settings` fields: ``depth``, ``overhead_repeats``,
    ``overhead_seconds`` (0 repeats: skip), ``mptcp`` (False: skip), ``mptcp_trials``,
    ``mptcp_congestions`` (e.g. ``(None, "cubic")``), ``congestion``, ``policy`` (``LINKESCAPE_POLICY``),
    ``flap_period_s``/``flap_cycles``, ``env``, ...
    """
    from ...testbed.netns import temporary_testbed

    log = log or (lambda s: print(s, flush=True))
    kinds = _check(faults, hosts, rails)
    if options.get("policy") is not None:
        _policy(options["policy"])
    st = Settings(faults=kinds, count=count, hosts=hosts, rails=rails, rate=rate, size=size, **options)
    t_start = time.time()
    result = _result(st.__dict__, t_start)
    env = cc_env(st.congestion)
    with temporary_testbed(hosts, rails, rate=rate, prefix="fo") as tb:
        result["congestion"] = st.congestion or namespace_congestion(tb)
        result["config"] = library_defaults({**st.env, **policy_env(st.policy), **env})
        log(f"failover bench: {hosts} hosts x {rails} rails at {rate}, all_reduce of {size} B x {st.depth} "
            f"in flight, {count} faults of each of {','.join(kinds)} on rail {st.fault_rail}, "
            f"congestion control {result['congestion']}, policy {result['config']['policy']}")
        for kind in kinds:
            raw = run_fault_series(tb, kind, st, log, env=env)
            result["series"][kind] = analyze_series(raw, st)
        if st.overhead_repeats > 0:
            log("healthy busbw: every rail (backup links) vs rail 0 only, alternating")
            result["overhead"] = run_overhead(tb, st, log, env=env)
    if st.mptcp:
        result["mptcp"] = run_mptcp_comparison(st, log)
    return _finish(result, t_start, json_path)


def library_defaults(env: Dict[str, str]) -> Dict[str, Any]:
    from ...common.config import Config

    merged = dict(os.environ)
    merged.update(env)
    cfg = Config.from_env({k: v for k, v in merged.items() if k.startswith("LINKESCAPE_")
                           and k not in ("LINKESCAPE_RAILS", "LINKESCAPE_EVENTS")})
    return {"heartbeat_ms": cfg.heartbeat_interval * 1e3, "silent_timeout_ms": cfg.silent_timeout * 1e3,
            "failback_holddown_ms": cfg.failback_holddown * 1e3, "reconnect_max_ms": cfg.reconnect_max * 1e3,
            "policy": cfg.policy, "chunk_bytes": cfg.chunk_bytes, "tcp_congestion": cfg.tcp_congestion,
            "op_timeout_s": 60.0}


def run_rate_bench(faults: Sequence[str] = FAULT_KINDS, hosts: int = 4, rails: int = 2, rate: str = "1gbit",
                   size: int = 4 << 20, policies: Sequence[Optional[str]] = ("active-backup",),
                   json_path: Optional[str] = None, log: Optional[Log] = None, **options: Any) -> dict:
    """The rate phases (issue 12; ``cross``: the relayed phase of issue 16) under every policy; returns the
    result dict (``result["rates"]``).

    ``options`` are other :class:`PhaseSettings` fields: ``phase_s`` (6), ``settle_s``, ``failback_s``,
    ``sub_s``, ``depth`` (1: a plain loop), ``flap_period_s``, ``congestion``, ``env``.
    """
    from .rates import run_rate_phases

    log = log or (lambda s: print(s, flush=True))
    kinds = _check(faults, hosts, rails, RATE_FAULT_KINDS)
    pols = tuple(_policy(p) for p in policies) or (None,)
    ps = PhaseSettings(faults=kinds, hosts=hosts, rails=rails, rate=rate, size=size, policies=pols, **options)
    if ps.phase_s < 2 * ps.sub_s:
        raise ValueError(f"a phase of {ps.phase_s:g} s is too short for windows of {ps.sub_s:g} s")
    t_start = time.time()
    result = _result({"mode": "rate-phases", **ps.__dict__}, t_start)
    result["config"] = library_defaults({**ps.env, **cc_env(ps.congestion)})
    result["rates"] = run_rate_phases(ps, log)
    return _finish(result, t_start, json_path)


__all__ = ["run_failover_bench", "run_rate_bench", "library_defaults"]
