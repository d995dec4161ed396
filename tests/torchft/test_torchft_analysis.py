"""linkescape.torchft.analysis and the demo's picture, on made-up step records (no testbed, no torchft run)."""

from __future__ import annotations

import pytest

from linkescape.torchft.analysis import analyse, table, window


def _rec(t, step, committed=True, quorum=1, participants=4, **kw):
    return {"t": t, "step": step, "committed": committed, "quorum_id": quorum, "participants": participants, **kw}


def test_window_counts_commits_discards_quorum_changes_and_the_longest_gap():
    recs = [_rec(0.5, 1), _rec(1.0, 2), _rec(4.0, 2, committed=False, error="TimeoutError"),
            _rec(5.0, 3, quorum=2, participants=3), _rec(5.5, 4, quorum=2, participants=3)]
    w = window(recs, 0.0, 6.0, quorum_before=1)
    assert w["committed"] == 4 and w["committed_per_min"] == 40.0
    assert w["discarded"] == 1 and w["errors"] == 1
    assert w["quorum_changes"] == 1
    assert w["max_without_commit_s"] == 4.0  # from 1.0 to 5.0
    assert w["participants"] == [3, 4]


def _result():
    recs = {h: [{"start": 0.0}] + [_rec(0.2 * k, k) for k in range(1, 25)] for h in range(4)}
    # host 3 lost at 5.0: the others commit without it from 6.0, with it again from 8.5 (it healed)
    for h in range(3):
        recs[h] += [_rec(6.0 + 0.2 * k, 50 + k, quorum=2, participants=3) for k in range(12)]
        recs[h] += [_rec(8.5 + 0.2 * k, 62 + k, quorum=3, participants=4) for k in range(10)]
    recs[3] += [_rec(8.5, 62, quorum=3, healing=True)] + [_rec(8.7 + 0.2 * k, 63 + k, quorum=3) for k in range(9)]
    faults = [{"what": "cut", "host": 1, "rail": 0, "at": 2.0, "repaired": 3.0, "error": None, "extra": {}},
              {"what": "host", "host": 3, "rail": None, "at": 5.0, "repaired": 8.0, "error": None,
               "extra": {"how": "every link cut"}}]
    finals = {h: {"step": 71, "params_sha256": "ab"} for h in range(4)}
    return {"options": {"backend": "linkescape", "whole": "links"}, "testbed": {"hosts": 4}, "t_together": 0.0,
            "faults": faults, "records": recs, "finals": finals}


def test_analyse_times_the_host_left_out_and_its_rejoin():
    rep = analyse(_result())
    rows = {r["fault"]: r for r in rep["rows"]}
    assert rows["cable cut"]["quorum_changes"] == 0 and rows["cable cut"]["discarded"] == 0
    lost = rows["host lost"]
    assert lost["left_out_s"] == 1.0 and lost["rejoined_s"] == 0.5
    assert lost["healed_from_peer"] and lost["quorum_changes"] == 2
    assert rep["same_parameters"]
    assert "| linkescape, host cut off | host lost |" in table([rep])


def test_different_parameters_or_a_missing_replica_are_reported():
    res = _result()
    res["finals"][2] = {"step": 71, "params_sha256": "cd"}
    assert not analyse(res)["same_parameters"]
    res["finals"][2] = None
    assert not analyse(res)["same_parameters"]


def test_the_timeline_picture(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("torchft")
    from linkescape.torchft.demo import plot

    res = _result()
    png = tmp_path / "timeline.png"
    plot(str(png), [res, res], [analyse(res), analyse(res)])
    assert png.stat().st_size > 10_000
