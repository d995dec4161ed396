"""Training under torchft on the testbed through both kinds of fault (issue 47 item 4): 4 replica groups,
one per host (2 rails, 1 Gbit/s), torchft's Manager and lighthouse, gradients averaged with
``manager.allreduce`` over linkescape's group (:mod:`linkescape.torchft.run`).

* a cable cut, a blackholed optic and a flap: no quorum change and no step discarded;
* host 3 loses every link (rails and management), or, in the second run, its process is killed: the
  others' next quorum leaves it out within 10 s, and they go on training, 3 groups;
* host 3 is repaired (its links come back, or its process starts again): it rejoins through torchft's
  recovery, and every replica ends at the same step with the same parameters.

Each run takes about 2 minutes; torchft's Gloo group on the same schedule is run by
``linkescape demo --torchft`` (docs/torchft.md has both side by side).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchft")


def _run(tmp_path, whole: str):
    from linkescape.testbed.netns import temporary_testbed
    from linkescape.testbed.pytest_fixtures import require_nft, require_testbed
    from linkescape.torchft.analysis import analyse, table
    from linkescape.torchft.run import Options, run_training

    require_testbed()
    require_nft()
    with temporary_testbed(4, 2, rate="1gbit", prefix="tft") as tb:
        result = run_training(tb, Options(backend="linkescape", whole=whole), str(tmp_path / whole))
    rep = analyse(result)
    print(table([rep]))
    print(json.dumps(rep, indent=1, default=str))
    return rep


def _check(rep):
    rows = {r["fault"]: r for r in rep["rows"]}
    for fault in ("cable cut", "blackholed optic", "flap"):
        row = rows[fault]
        assert row["quorum_changes"] == 0, row
        assert row["discarded"] == 0, row
        assert row["participants"] == [4], row
        assert "fault_error" not in row, row
    lost = rows["host lost"]
    assert "fault_error" not in lost, lost
    assert lost["left_out_s"] is not None and lost["left_out_s"] <= 10.0, lost
    assert 3 in lost["participants"], lost  # training went on with 3 groups
    assert lost["rejoined_s"] is not None, lost  # and the host trained with them again
    assert lost["healed_from_peer"], lost  # through torchft's recovery
    assert lost["configures"] == ["shrunk"], lost  # the quorums without it kept the others' links
    assert rep["same_parameters"], rep["final_steps"]
    assert len(set(rep["final_steps"].values())) == 1, rep["final_steps"]


@pytest.mark.testbed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_host_cut_off_from_every_link_is_left_out_and_rejoins(tmp_path):
    _check(_run(tmp_path, "links"))


@pytest.mark.testbed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_replica_is_left_out_and_rejoins(tmp_path):
    _check(_run(tmp_path, "kill"))
