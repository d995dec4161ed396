"""linkescape bench --scale: the row built from every rank's figures, and one real 2-rank run
(its JSON has every column of the table for both backends: the back-to-back loop, the isolated
call, and per call the CPU time and context switches of a rank)."""

from __future__ import annotations

import json

import pytest

from linkescape.bench import scale


def _rank(init: float, cpu: float, t4: list, t1m: list) -> dict:
    both = lambda le, gl: {"linkescape": le, "gloo": gl}  # noqa: E731
    return {"init": both(init, 2 * init), "group": both(init / 2, init), "init_cpu": both(cpu, cpu / 2), "links": both(2 * init, 2 * init),
            "fds": both(3, 2),
            "idle_cpu": both(0.001, 0.002), "store_calls_per_s": both(1.0, 0.0),
            "times": {"4": both(t4, [x * 2 for x in t4]), str(1 << 20): both(t1m, t1m)},
            "isolated": {"4": both([x / 2 for x in t4], t4), str(1 << 20): both(t1m, t1m)},
            "usage": {s: both({"cpu_us": cpu * 1e3, "vcsw": 2.0, "ivcsw": 0.5}, {"cpu_us": cpu * 2e3, "vcsw": 4.0,
                                                                                  "ivcsw": 1.0})
                      for s in ("4", str(1 << 20))},
            "isolated_usage": {s: both({"cpu_us": cpu * 1e4, "vcsw": 3.0, "ivcsw": 0.0}, {"cpu_us": cpu * 2e4,
                                                                                         "vcsw": 6.0, "ivcsw": 0.0})
                               for s in ("4", str(1 << 20))}}


def test_a_row_takes_the_slowest_rank_per_round_and_the_median_of_the_rest():
    ranks = [_rank(0.1, 0.010, [10, 30, 20], [100, 100, 100]),
             _rank(0.3, 0.020, [15, 10, 25], [100, 300, 100]),
             _rank(0.2, 0.030, [10, 10, 10], [100, 100, 100])]
    row = scale.summarize(3, ranks)
    le, gl = row["linkescape"], row["gloo"]
    assert le["init_s"] == 0.3 and gl["init_s"] == 0.6  # the slowest rank
    assert le["links_s"] == 0.6
    assert le["group_s"] == 0.15 and gl["group_s"] == 0.3  # the slowest rank
    assert le["init_cpu_ms"] == pytest.approx(20.0) and gl["init_cpu_ms"] == pytest.approx(10.0)  # the median rank
    assert le["allreduce_4B_us"] == 25  # worst per round: 15, 30, 25 -> median 25
    assert le["allreduce_1MiB_us"] == 100
    # isolated calls: per call index the slowest rank ([7.5, 15, 12.5]), then the median over calls
    assert le["allreduce_4B_isolated_us"] == 12.5 and gl["allreduce_4B_isolated_us"] == 25
    assert le["allreduce_4B_isolated_cpu_us"] == pytest.approx(200.0)  # the median rank (cpu 0.020)
    assert gl["allreduce_1MiB_cpu_us"] == pytest.approx(40.0) and gl["allreduce_1MiB_isolated_vcsw"] == 6.0
    assert le["allreduce_4B_ivcsw"] == 0.5
    line = scale.format_row(row)
    assert line.split("|")[0].strip() == "3" and "20.0 / 10.0" in line and line.rstrip().endswith("1.00x")
    assert [c.strip() for c in line.split("|")[-4:]] == ["0.50x", "0.50x", "1.00x", "1.00x"]
    assert len(line.split("|")) == len(scale.header().split("|"))


def test_two_ranks_side_by_side_report_every_column(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "scale.json"
    lines = []
    rows = scale.run_scale([2], str(out), echo=lines.append, idle=2.0, rounds=1)
    on_disk = [json.loads(l) for l in out.read_text().splitlines()]
    assert on_disk == json.loads(json.dumps(rows))
    for backend in scale.BACKENDS:
        rec = rows[0][backend]
        for key, _title, _fmt in scale.COLUMNS:
            assert rec[key] >= 0, (backend, key, rec)
        assert rec["init_s"] > 0 and rec["group_s"] > 0 and rec["allreduce_4B_us"] > 0
    assert rows[0]["linkescape"]["init_cpu_ms"] > 0
    for backend in scale.BACKENDS:  # the isolated call and what a call costs the rank process
        rec = rows[0][backend]
        for size in ("4B", "1MiB"):
            assert rec[f"allreduce_{size}_isolated_us"] > 0
            for mode in ("", "_isolated"):
                assert rec[f"allreduce_{size}{mode}_cpu_us"] > 0, (backend, size, mode)  # a call costs CPU
                assert rec[f"allreduce_{size}{mode}_vcsw"] >= 0 and rec[f"allreduce_{size}{mode}_ivcsw"] >= 0
                # the calling thread is part of the process: its share is no more than the whole
                caller = rec[f"allreduce_{size}{mode}_caller_cpu_us"]
                assert 0 < caller <= rec[f"allreduce_{size}{mode}_cpu_us"] * 1.001 + 1, (backend, size, mode, rec)
                assert rec[f"allreduce_{size}{mode}_caller_vcsw"] <= rec[f"allreduce_{size}{mode}_vcsw"]
    # Gloo's threads block on their sockets: a 1 MiB exchange with another process sleeps and wakes
    # at least once per call (linkescape may spin instead: LINKESCAPE_SPIN_US)
    assert rows[0]["gloo"]["allreduce_1MiB_isolated_vcsw"] >= 1, rows[0]["gloo"]
    assert rows[0]["linkescape"]["store_calls_per_s_per_rank"] <= 2.0  # the beacon: about one a second (2 s window)
    assert lines[0].startswith("# linkescape bench --scale 2") and lines[2].split("|")[0].strip() == "2"
