"""What the ranks' event trails say about a fault, and summaries of the times measured.

Shared by the failover benchmark and the chaos soak:

* :func:`first_event`: the first event of some kinds in a time window, of
  one peer, about one rail;
* :func:`summarize`: n, median, p99, min, max and mean of a list with gaps
  (a fault nobody detected is a gap, counted as missing).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

import numpy as np


def rail_of(e: Mapping[str, Any]) -> Optional[int]:
    """The rail an event is about: for a ``failover`` the rail left (``from_rail``), else ``rail``."""
    return e.get("from_rail", e.get("rail")) if e.get("event") == "failover" else e.get("rail")


def first_event(events: Sequence[Mapping[str, Any]], kinds: Union[str, Sequence[str]], t0: float, t1: float, *,
                peer: Optional[int] = None, rail: Optional[int] = None,
                closed: bool = False) -> Optional[Mapping[str, Any]]:
    """The first event of ``kinds`` (one name or several) in ``[t0, t1)`` (``closed``: ``[t0, t1]``);
    with ``peer``: on the link to that peer; with ``rail``: about that rail (:func:`rail_of`)."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    for e in events:
        ts = e.get("ts", 0)
        if (e.get("event") in kinds and t0 <= ts and (ts <= t1 if closed else ts < t1)
                and (peer is None or e.get("peer") == peer) and (rail is None or rail_of(e) == rail)):
            return e
    return None


def summarize(values: Iterable[Optional[float]]) -> Dict[str, Any]:
    """n, median, p99, min, max, mean of the non-missing values (same unit); ``missing`` counts Nones."""
    vals = list(values)
    got = np.array([v for v in vals if v is not None], dtype=float)
    out: Dict[str, Any] = {"n": int(got.size), "missing": len(vals) - int(got.size)}
    if got.size:
        out.update(median=float(np.median(got)), p99=float(np.percentile(got, 99)),
                   min=float(got.min()), max=float(got.max()), mean=float(got.mean()))
    else:
        out.update(median=None, p99=None, min=None, max=None, mean=None)
    return out


__all__ = ["first_event", "rail_of", "summarize"]
