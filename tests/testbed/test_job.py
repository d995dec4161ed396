"""RankJob, the one job runner: local ranks here (no root needed); the testbed ones run in the fault,
chaos, demo and failover benchmark tests."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from linkescape.testbed.job import RankJob, Tail, exit_status

# A rank: says ready, counts until the stop file appears, says exit. "hang" ignores the stop file;
# "fail" exits 3 at once. faulthandler dumps its stacks on SIGUSR1, like the project's workers.
RANK = textwrap.dedent("""
    import faulthandler, json, os, signal, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rank, mode, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    def say(**r):
        print(json.dumps(r), flush=True)
    say(event="ready", mode=mode)
    if mode == "fail":
        print("boom", file=sys.stderr, flush=True)
        sys.exit(3)
    it = 0
    while mode == "hang" or not os.path.exists(stop):
        say(event="done", iter=it)
        it += 1
        time.sleep(0.02)
    say(event="exit", wrong=0, error=None, iters=it)
""")


def _job(tmp_path, modes, **kw):
    stop = str(tmp_path / "stop")
    cmds = [[sys.executable, "-c", RANK, str(r), m, stop] for r, m in enumerate(modes)]
    return RankJob(cmds, workdir=str(tmp_path), **kw)


def test_ranks_are_followed_and_stop_together(tmp_path):
    seen = []
    with _job(tmp_path, ["run", "run"], on_record=lambda rank, rec: seen.append((rank, rec["event"]))) as job:
        assert job.wait_for("ready", rank=1, timeout=30)["mode"] == "run"
        job.wait_for("done", rank=0, iter=3, timeout=30)
        job.wait(lambda: len(job.records_of(1, "done")) >= 3, 30, "three iterations of rank 1")
        exits = job.finish(timeout=30)
    assert [e["rank"] for e in exits] == [0, 1]
    assert all(e["error"] is None and not job.hung[e["rank"]] for e in exits)
    assert all(e["iters"] >= 3 for e in exits)
    assert (0, "exit") in seen and (1, "ready") in seen
    assert os.path.exists(tmp_path / "stop")  # the stop file is how ranks stop together


def test_a_hung_rank_has_its_stacks_dumped_and_is_killed(tmp_path):
    job = _job(tmp_path, ["run", "hang"])
    try:
        job.wait_for("done", rank=1, iter=2, timeout=30)
        exits = job.finish(timeout=2.0, dump_wait=1.0)
    finally:
        job.close()
    assert exits[0]["error"] is None
    assert exits[1]["hung"] is True and exits[1]["error"] == "hung" and job.hung == [False, True]
    assert "Current thread" in exits[1]["stderr"] or "Thread" in exits[1]["stderr"]  # faulthandler's dump
    assert all(p.poll() is not None for p in job.procs)


def test_a_dead_rank_is_reported_and_waiting_on_it_fails(tmp_path):
    job = _job(tmp_path, ["run", "fail"])
    try:
        with pytest.raises(RuntimeError, match=r"\[1\]"):
            job.wait(lambda: False, 30, "something that never comes")
        exits = job.finish(timeout=10)
    finally:
        job.close()
    assert exits[1]["hung"] is False and exits[1]["error"] == "died (exit 3)" and "boom" in exits[1]["stderr"]


def test_wait_exit_reports_the_failure_not_its_victims(tmp_path):
    # rank 1 fails; rank 0 would run forever: after the grace period it is stopped, and the status is 3
    job = _job(tmp_path, ["hang", "fail"], session=True)
    try:
        assert job.wait_exit(timeout=60, grace=0.5) == 3
    finally:
        job.close()
    job = _job(tmp_path, ["hang", "hang"], session=True)
    try:
        assert job.wait_exit(timeout=1.0, grace=0.5) == 124
    finally:
        job.close()
    assert exit_status(-9) == 137


def test_log_mode_tags_every_line_with_its_host(tmp_path):
    log = tmp_path / "out.log"
    job = _job(tmp_path, ["fail", "fail"], log=str(log), session=True)
    try:
        assert job.wait_exit(timeout=60, grace=5) == 3
    finally:
        job.close()
    lines = log.read_text().splitlines()
    assert {line.split(" ", 1)[0] for line in lines} == {"[h0]", "[h1]"}
    assert sum("boom" in line for line in lines) == 2


def test_tail_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = Tail(str(path))
    assert tail.read() == []
    path.write_text('{"a": 1}\n{"b"')
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write(': 2}\nnot json\n')
    assert tail.read() == [{"b": 2}] and tail.records == [{"a": 1}, {"b": 2}]
