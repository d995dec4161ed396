"""``linkescape trace analyze DIR``: read every rank's flight-recorder dump and say
which rank is behind, and on which operation the ranks disagree or wait.

The dumps are the files ``linkescape.flight`` writes (one per rank and
occasion; the latest of each rank counts). Ranks are grouped by job (one
communicator: the world, or a torch subgroup).

Reasoning, in order:

1. **Disagreement**: the lowest collective sequence number at which two ranks
   recorded different operations (name, dtype, count, reduce op, root). The
   ranks outside the largest group are named. Without a clear majority (two
   ranks), the ranks that ``CollectiveMismatch`` errors name are used.
2. **Waiting**: the lowest collective not done on every rank. Behind are the
   ranks that had not posted it when they dumped, else the ranks that posted
   it only after another rank had already timed out on it, else the ranks the
   others wait on that wait on nobody themselves (or left no dump).
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..observe.flight import FORMAT

SIG_KEYS = ("op", "dtype", "count", "reduce_op", "root")


def load_dumps(paths: Iterable[str]) -> List[Dict[str, Any]]:
    """Every flight-recorder dump in the given files or directories."""
    files: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True))
        else:
            files.append(p)
    out = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                d = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("format") == FORMAT:
            d["_file"] = f
            out.append(d)
    return out


def signature(e: Dict[str, Any]) -> Tuple:
    return tuple(e.get(k) for k in SIG_KEYS)


def describe(e: Dict[str, Any]) -> str:
    parts = [str(e.get("op"))]
    if e.get("dtype") is not None:
        parts.append(f"{e['dtype']}[{e.get('count')}]")
    if e.get("reduce_op") is not None:
        parts.append(str(e["reduce_op"]))
    if e.get("root") is not None:
        parts.append(f"root {e['root']}")
    return " ".join(parts)


def _ranks(rs: Iterable[int]) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def analyze_job(dumps: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One job's dumps (any number per rank) -> the findings."""
    latest: Dict[int, Dict[str, Any]] = {}
    for d in dumps:
        r = int(d["rank"])
        if r not in latest or d.get("dumped_at", 0) >= latest[r].get("dumped_at", 0):
            latest[r] = d
    world = max(int(d.get("world_size") or 0) for d in latest.values())
    ranks = sorted(latest)
    missing = [r for r in range(world) if r not in latest]
    coll: Dict[int, Dict[int, Dict[str, Any]]] = {
        r: {e["seq"]: e for e in latest[r].get("entries", []) if e.get("collective")} for r in ranks}
    posted = {r: int((latest[r].get("last_collective") or {}).get("posted") or max(coll[r], default=0))
              for r in ranks}
    done = {r: int((latest[r].get("last_collective") or {}).get("done") or 0) for r in ranks}
    out: Dict[str, Any] = {
        "job": latest[ranks[0]].get("job"), "world_size": world, "ranks": ranks, "missing_ranks": missing,
        "per_rank": {r: {"reason": latest[r].get("reason"), "error": latest[r].get("error"),
                         "last_posted": posted[r], "last_done": done[r], "file": latest[r].get("_file"),
                         "pending": [e["seq"] for e in coll[r].values() if e.get("state") in ("posted", "started")]}
                     for r in ranks},
        "mismatch": None, "waiting": None, "behind": [], "verdict": "",
    }
    out["mismatch"] = _mismatch(coll, latest)
    out["channels"] = _channels(latest)
    if out["mismatch"] is not None:
        m = out["mismatch"]
        out["behind"] = m["odd"]
        groups = "; ".join(f"{_ranks(g['ranks'])}: {g['op']}" for g in m["groups"])
        who = (f"{_ranks(m['odd'])} differ{'s' if len(m['odd']) == 1 else ''}" if m["odd"]
               else "no majority, and no error names a rank")
        out["verdict"] = f"ranks disagree at collective #{m['seq']} ({groups}): {who}"
        return out
    w = _waiting(coll, posted, latest, missing)
    out["waiting"] = w
    if w is None:
        out["verdict"] = (f"no operation in disagreement or waiting: every rank finished collective "
                          f"#{max(done.values(), default=0)}" + (f"; no dump from {_ranks(missing)}" if missing else ""))
        return out
    out["behind"] = w["behind"]
    if w["behind"]:
        why = {"not_posted": "had not posted it", "late": "posted it only after others had timed out on it",
               "waited_on": "is waited on and waits for nobody", "no_dump": "left no dump and is waited on",
               "named_by_errors": "is named by the errors"}[w["why"]]
        out["verdict"] = (f"{_ranks(w['behind'])} behind: collective #{w['seq']} ({w['op']}) is pending on "
                          f"{_ranks(w['pending_on'])}; {_ranks(w['behind'])} {why}")
    else:
        out["verdict"] = f"collective #{w['seq']} ({w['op']}) is pending on {_ranks(w['pending_on'])}; no rank stands out"
    return out


def _mismatch(coll, latest) -> Optional[Dict[str, Any]]:
    seqs = sorted(set().union(*[set(c) for c in coll.values()])) if coll else []
    for seq in seqs:
        have = {r: coll[r][seq] for r in coll if seq in coll[r]}
        if len(have) < 2:
            continue
        groups: Dict[Tuple, List[int]] = {}
        for r, e in have.items():
            groups.setdefault(signature(e), []).append(r)
        if len(groups) < 2:
            continue
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        if len(ordered[0][1]) > len(ordered[1][1]):
            odd = sorted(r for _, rs in ordered[1:] for r in rs)
        else:
            odd = _named_by(latest, "CollectiveMismatch", seq)
        return {"seq": seq, "odd": odd,
                "groups": [{"ranks": sorted(rs), "op": describe(have[rs[0]])} for _, rs in ordered]}
    named = _named_by(latest, "CollectiveMismatch", None)
    if named:
        seqs_err = [e.get("seq") for d in latest.values() for e in d.get("entries", [])
                    if (e.get("error") or {}).get("type") == "CollectiveMismatch"]
        return {"seq": min(s for s in seqs_err if s is not None) if seqs_err else None, "odd": named, "groups": []}
    return None


def _named_by(latest, etype: str, seq: Optional[int]) -> List[int]:
    """Peers named by errors of ``etype`` (most often first; ties all)."""
    votes: Counter = Counter()
    for r, d in latest.items():
        errs = [e.get("error") for e in d.get("entries", []) if seq is None or e.get("seq") == seq]
        errs.append(d.get("error"))
        for err in errs:
            if err and err.get("type") == etype and err.get("peer") is not None:
                votes[int(err["peer"])] += 1
    if not votes:
        return []
    top = max(votes.values())
    return sorted(p for p, n in votes.items() if n == top)


def _waiting(coll, posted, latest, missing) -> Optional[Dict[str, Any]]:
    ranks = sorted(coll)
    candidates = set()
    for r in ranks:
        for seq, e in coll[r].items():
            if e.get("state") != "done":
                candidates.add(seq)
    for r in ranks:
        if posted[r] < max(posted.values()):
            candidates.add(posted[r] + 1)
    if not candidates and not missing:
        return None
    if not candidates:
        return None
    seq = min(candidates)
    entries = {r: coll[r][seq] for r in ranks if seq in coll[r]}
    op = describe(next(iter(entries.values()))) if entries else "?"
    pending_on = sorted(r for r, e in entries.items() if e.get("state") != "done")
    base = {"seq": seq, "op": op, "pending_on": pending_on,
            "waiting_on": {r: e.get("waiting_on") or (e.get("error") or {}).get("peers") or []
                           for r, e in entries.items() if e.get("state") != "done"}}
    not_posted = sorted(r for r in ranks if posted[r] < seq)
    if not_posted:
        return {**base, "behind": not_posted, "why": "not_posted"}
    gave_up = [e.get("done") for e in entries.values()
               if (e.get("error") or {}).get("type") == "CommTimeout" and e.get("done")]
    if gave_up:
        first = min(gave_up)
        late = sorted(r for r, e in entries.items() if (e.get("posted") or 0) > first)
        if late:
            return {**base, "behind": late, "why": "late"}
    graph = {r: set(int(p) for p in ps) for r, ps in base["waiting_on"].items()}
    waited = set().union(*graph.values()) if graph else set()
    no_dump = sorted(p for p in waited if p in missing)
    if no_dump:
        return {**base, "behind": no_dump, "why": "no_dump"}
    sinks = sorted(p for p in waited if not graph.get(p))
    if sinks:
        return {**base, "behind": sinks, "why": "waited_on"}
    for etype in ("PeerLost", "LinkFailure"):
        named = _named_by(latest, etype, None)
        if named:
            return {**base, "behind": named, "why": "named_by_errors"}
    return {**base, "behind": [], "why": None}


def _channels(latest) -> List[Dict[str, Any]]:
    """Frames sent by one rank and not yet applied by its peer, per pair (from the dumps' counters)."""
    out = []
    for r, d in sorted(latest.items()):
        for p, c in (d.get("peers") or {}).items():
            p = int(p)
            other = latest.get(p)
            recv = ((other or {}).get("peers") or {}).get(str(r), {}).get("received") if other else None
            sent = c.get("sent")
            if sent is None:
                continue
            gap = None if recv is None else sent - recv
            if gap or c.get("lost") or c.get("no_path_s") or (c.get("acked") is not None and c["acked"] < sent):
                out.append({"from": r, "to": p, "sent": sent, "acked": c.get("acked"), "received_by_peer": recv,
                            "not_applied": gap, "lost": c.get("lost"), "no_path_s": c.get("no_path_s")})
    return out


def analyze(dumps: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """All dumps -> findings per job (largest job first)."""
    jobs: Dict[str, List[Dict[str, Any]]] = {}
    for d in dumps:
        jobs.setdefault(str(d.get("job") or ""), []).append(d)
    results = [analyze_job(ds) for ds in jobs.values()]
    return sorted(results, key=lambda x: (-x["world_size"], str(x["job"])))


def format_text(results: List[Dict[str, Any]]) -> str:
    lines: List[str] = []
    for res in results:
        lines.append(f"job {res['job'] or '?'}: {res['world_size']} ranks, dumps from {len(res['ranks'])}"
                     + (f" (none from {_ranks(res['missing_ranks'])})" if res["missing_ranks"] else ""))
        lines.append(f"  verdict: {res['verdict']}")
        for r, pr in sorted(res["per_rank"].items()):
            err = pr["error"]
            lines.append(f"  rank {r}: {pr['reason']:<12} last collective posted #{pr['last_posted']}, done "
                         f"#{pr['last_done']}" + (f", pending {pr['pending']}" if pr["pending"] else "")
                         + (f"; {err['type']}: {err['message']}" if err else ""))
        w = res.get("waiting")
        if w and w.get("waiting_on"):
            for r, ps in sorted(w["waiting_on"].items()):
                if ps:
                    lines.append(f"  rank {r} waits on {_ranks(ps)} in collective #{w['seq']}")
        for c in res.get("channels") or []:
            lines.append(f"  frames {c['from']}->{c['to']}: sent {c['sent']}, acked {c['acked']}, applied by peer "
                         f"{c['received_by_peer']}" + (f", lost: {c['lost']}" if c.get("lost") else ""))
    return "\n".join(lines) + "\n"


__all__ = ["load_dumps", "analyze", "analyze_job", "format_text", "describe", "signature"]
