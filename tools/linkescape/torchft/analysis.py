"""What each fault of a torchft training run cost: steps committed per minute, steps discarded, quorum
changes, the longest time without a committed step; for the lost host, the time until the others' quorum
left it out and until it trained with them again; whether every replica ended with the same parameters.

Everything is read from the replicas' step records (:mod:`.train`) and the faults played (:mod:`.run`),
as seen by replica 0 (host 0 is never faulted: it holds the lighthouse).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

#: the names of the windows, in the order of :data:`.run.SCHEDULE`
LABELS = {"cut": "cable cut", "blackhole": "blackholed optic", "flap": "flap", "host": "host lost"}


def _steps(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in records if "t" in r]


def window(records: List[Dict[str, Any]], start: float, end: float, quorum_before: Optional[int]) -> Dict[str, Any]:
    """The cost of what happened between ``start`` and ``end`` (wall times) to one replica."""
    inside = [r for r in _steps(records) if start <= r["t"] < end]
    commits = [r["t"] for r in inside if r.get("committed")]
    gaps = [b - a for a, b in zip([start] + commits, commits + [end])]
    quorums = [quorum_before] + [r.get("quorum_id") for r in inside]
    changes = sum(1 for a, b in zip(quorums, quorums[1:]) if a is not None and b is not None and a != b)
    minutes = max(end - start, 1e-9) / 60.0
    return {"seconds": round(end - start, 2), "committed": len(commits),
            "committed_per_min": round(len(commits) / minutes, 1),
            "discarded": sum(1 for r in inside if not r.get("committed")),
            "errors": sum(1 for r in inside if r.get("error")),
            "quorum_changes": changes, "max_without_commit_s": round(max(gaps), 2) if gaps else None,
            "participants": sorted({r.get("participants") for r in inside if r.get("participants") is not None})}


def _first(records, after: float, pred) -> Optional[float]:
    for r in _steps(records):
        if r["t"] >= after and pred(r):
            return r["t"]
    return None


def analyse(result: Dict[str, Any], observer: int = 0) -> Dict[str, Any]:
    """The report of one run (:func:`.run.run_training`'s result)."""
    recs = result["records"]
    hosts = int(result["testbed"]["hosts"])
    mine = recs.get(observer) or recs.get(str(observer)) or []
    faults = result.get("faults") or []
    t_end = max((r["t"] for r in _steps(mine)), default=0.0)
    t0 = result.get("t_together") or (faults[0]["at"] if faults else 0.0)
    rows = []
    starts = [f["at"] for f in faults]

    def quorum_at(t: float) -> Optional[int]:
        q = None
        for r in _steps(mine):
            if r["t"] >= t:
                break
            q = r.get("quorum_id")
        return q

    if faults:
        rows.append({"fault": "before the faults", **window(mine, t0, starts[0], quorum_at(t0))})
    for i, f in enumerate(faults):
        end = starts[i + 1] if i + 1 < len(starts) else t_end + 1e-6
        row = {"fault": LABELS.get(f["what"], f["what"]), "host": f["host"], "rail": f["rail"],
               **window(mine, f["at"], end, quorum_at(f["at"]))}
        if f.get("error"):
            row["fault_error"] = f["error"]
        if f["what"] == "host":
            left = _first(mine, f["at"], lambda r: r.get("committed") and (r.get("participants") or hosts) < hosts)
            back = None
            if f.get("repaired"):
                back = _first(mine, f["repaired"], lambda r: r.get("committed") and r.get("participants") == hosts)
            row["how"] = f.get("extra", {}).get("how")
            row["left_out_s"] = round(left - f["at"], 2) if left is not None else None
            row["rejoined_s"] = round(back - f["repaired"], 2) if back is not None else None
            lost = recs.get(f["host"]) or recs.get(str(f["host"])) or []
            healed = _first(lost, f["repaired"] or f["at"], lambda r: r.get("healing"))
            row["healed_from_peer"] = healed is not None
            # how the quorums without the host got their group: "shrunk" (links kept) or "built"
            row["configures"] = sorted({r["configure"] for r in _steps(mine)
                                        if f["at"] <= r["t"] and r.get("configure")
                                        and (r.get("participants") or hosts) < hosts
                                        and (f.get("repaired") is None or r["t"] < f["repaired"])})
        rows.append(row)
    finals = result.get("finals") or {}
    digests = {str(h): (v or {}).get("params_sha256") for h, v in finals.items()}
    steps = {str(h): (v or {}).get("step") for h, v in finals.items()}
    same = len(digests) == hosts and None not in digests.values() and len(set(digests.values())) == 1
    return {"backend": result["options"]["backend"], "whole": result["options"]["whole"], "rows": rows,
            "final_steps": steps, "same_parameters": same, "exit": result.get("exit")}


def table(reports: List[Dict[str, Any]]) -> str:
    """A markdown table of several runs' rows, side by side."""
    head = ("| run | fault | steps committed/min | discarded | quorum changes | longest without a commit (s) "
            "| replicas | left out (s) | rejoined (s) |")
    lines = [head, "|" + "---|" * 9]
    for rep in reports:
        name = f"{rep['backend']}, host {'killed' if rep['whole'] == 'kill' else 'cut off'}"
        for row in rep["rows"]:
            lines.append(f"| {name} | {row['fault']} | {row['committed_per_min']} | {row['discarded']} "
                         f"| {row['quorum_changes']} | {row['max_without_commit_s']} "
                         f"| {','.join(str(p) for p in row['participants'])} | {row.get('left_out_s', '')} "
                         f"| {row.get('rejoined_s', '')} |")
        lines.append(f"| {name} | end | final steps {sorted(set(rep['final_steps'].values()), key=str)} | | | | "
                     f"| same parameters: {'yes' if rep['same_parameters'] else 'NO'} | |")
    return "\n".join(lines)


__all__ = ["analyse", "window", "table", "LABELS"]
