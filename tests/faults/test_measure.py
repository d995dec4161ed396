"""What the event trails say about a fault (linkescape.faults.measure), shared by the failover benchmark
and the chaos soak."""

from __future__ import annotations

from linkescape.faults.measure import first_event, rail_of, summarize


def _ev(ts, event, peer=1, rail=0, **extra):
    return {"ts": ts, "event": event, "peer": peer, "rail": rail, **extra}


def test_first_event_by_kind_window_peer_and_rail():
    evs = [_ev(1.0, "link_down", rail=1), _ev(2.0, "link_down"), _ev(2.5, "failover", peer=2, rail=1, from_rail=0),
           _ev(3.0, "failover", rail=1, from_rail=0), _ev(4.0, "failback")]
    assert first_event(evs, "link_down", 0, 9)["ts"] == 1.0
    assert first_event(evs, "link_down", 0, 9, rail=0)["ts"] == 2.0
    assert first_event(evs, "failover", 0, 9, peer=1)["ts"] == 3.0
    assert first_event(evs, ("link_down", "failover"), 2.1, 9, rail=0)["ts"] == 2.5  # a failover's rail: the one left
    assert first_event(evs, "failback", 0, 4.0) is None  # [t0, t1)
    assert first_event(evs, "failback", 0, 4.0, closed=True)["ts"] == 4.0  # [t0, t1]
    assert rail_of(evs[2]) == 0 and rail_of(evs[0]) == 1


def test_summarize_counts_missing_and_percentiles():
    s = summarize([1.0, None, 3.0, 2.0])
    assert (s["n"], s["missing"], s["median"], s["min"], s["max"], s["mean"]) == (3, 1, 2.0, 1.0, 3.0, 2.0)
    assert 2.9 < s["p99"] <= 3.0
    assert summarize(v for v in [None]) == {"n": 0, "missing": 1, "median": None, "p99": None, "min": None,
                                            "max": None, "mean": None}
