"""`linkescape simulate --failure-log`: an operator's own faults, replayed and checked by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.errors import UsageError
from linkescape.tools.failures import classify, read_failure_log

LOG = """cause,start,repair time,host,rail
faulty network cable,10,2h,node-a,eth0
network switch,50,60min,node-b,
GPU HBM3,70,0,node-a,
"""
# 100 h, two hosts of 8 GPUs, checkpoint every 4 h (free), restart 1 h, a path waited for 0.5 h.
# restart: 10 h (2 h since the checkpoint lost, back at 11), 50 h (39 h on, 3 lost, back at 51),
#          70 h (19 h on, 3 lost, back at 71), 29 h to the end: 8 + 36 + 16 + 29 = 89 h of work
# escape:  the cable is escaped; the switch takes host 1's every rail: wait 0.5 h, fail at 50.5 h
#          (2 h lost), back at 51.5; 70 h: 18.5 h on, 2.5 lost, back at 71; 29 h: 48 + 16 + 29 = 93 h
ARGS = ["--days", str(100 / 24), "--gpus", "16", "--checkpoint-hours", "4", "--checkpoint-write-seconds", "0",
        "--restart-hours", "1", "--no-path-seconds", "1800", "--escape-stall-ms", "0"]


def replay(tmp_path, text, *args):
    path = tmp_path / "log.csv"
    path.write_text(text)
    res = CliRunner().invoke(main, ["simulate", "--failure-log", str(path), *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_a_replay_by_hand(tmp_path):
    d = json.loads(replay(tmp_path, LOG, *ARGS, "--json"))
    assert d["replay"] and d["trials"] == 1
    assert d["restart"]["ettr"] == pytest.approx(0.89)
    assert d["escape"]["ettr"] == pytest.approx(0.93)
    assert d["escape"]["escaped"] == 1 and d["escape"]["interruptions_by_cause"]["isolated"] == 1
    assert d["escape"]["wait_hours"] == pytest.approx(0.5)
    assert d["saved"]["escape"]["yuan_saved"] == pytest.approx(0.04 * 16 * 100 * 10)
    assert [d["faults_per_run"][k] for k in ("cable", "switch", "other")] == [1, 1, 1]


def test_dates_units_and_column_names(tmp_path):
    text = ("Host,Rail,Category,Started,MTTR\n"
            "node-a,eth0,Faulty Network Cable,2026-03-01T10:00:00,7200s\n"
            "node-b,all,Faulty Network Switch,2026-03-02T02:00:00,1:00\n"
            "node-a,,GPU HBM3 Memory,2026-03-02 22:00:00,0\n")
    # the earliest fault is the run's start: 0, 16 and 36 h: the same by hand as above, shifted
    d = json.loads(replay(tmp_path, text, *ARGS, "--json"))
    assert d["log"]["dated"] and d["log"]["rows"] == 3
    # restart: 0 h (nothing lost, back at 1), 16 h (15 on, 3 lost, back at 17), 36 h (19 on, 3 lost, back at 37),
    # 63 h to the end: 12 + 16 + 63 = 91
    assert d["restart"]["ettr"] == pytest.approx(0.91)


def test_the_log_sets_the_run_length_and_the_interval(tmp_path):
    d = json.loads(replay(tmp_path, LOG, "--gpus", "16", "--json"))
    assert d["inputs"]["days"] == 3  # the last fault ends at 70 h: 3 days, rounded up
    # Young/Daly for the log's own mean time between faults: 72 h / 3
    assert d["inputs"]["checkpoint_hours"] == pytest.approx((2 * 10 / 3600 * 24) ** 0.5)


def test_the_text_says_it_is_a_replay(tmp_path):
    out = replay(tmp_path, LOG, *ARGS)
    assert "replay of" in out and "no sampling interval" in out


def test_causes_by_their_words():
    assert [classify(c) for c in ("Faulty Network Interface Card", "network switch/cable", "optical transceiver",
                                  "cable", "GPU HBM3", "NIC")] == ["nic", "switch", "optic", "cable", "other", "nic"]


@pytest.mark.parametrize("text", ["host,rail\n0,1\n", "cause,start,host\nnic,soon,0\n", "cause,start,host\n"])
def test_a_bad_log_is_refused(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UsageError):
        read_failure_log(str(path))
    assert CliRunner().invoke(main, ["simulate", "--failure-log", str(path)]).exit_code != 0


def test_a_rail_beyond_the_cluster_is_refused(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("cause,start,repair,host,rail\nnic,1,1,0,5\n")
    res = CliRunner().invoke(main, ["simulate", "--failure-log", str(path), "--rails", "2"])
    assert res.exit_code != 0 and "rail 5" in res.output
