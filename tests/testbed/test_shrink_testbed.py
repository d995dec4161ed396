"""A host cut off from every rail, on real NICs (veth carrier loss), under torch with the
linkescape backend (issue 47 items 1-2):

- rails only (the store still answers): the others' call fails within torch's ``timeout=``
  (it caps the no-path deadline, 1800 s here), naming the host; the next one at once; they
  shrink the group and go on, exact; the host cut off gets a typed error, never a result;
- every rail and the management link (the store) too: the others tell it from a slow host
  and name it lost within 5 s, as a dead process, far inside the timeout; they shrink and go on.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.testbed

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shrink_worker.py")


def _run(tb, tmp_path, timeout_s: float, cut_mgmt: bool):
    world = tb.hosts
    port = random.randint(20000, 40000)
    env = dict(os.environ, LINKESCAPE_RAILS="r0,r1", LINKESCAPE_NO_PATH_TIMEOUT="1800", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", LINKESCAPE_EVENTS=str(tmp_path / "events-{rank}.jsonl"))
    procs = [tb.popen(i, [sys.executable, WORKER, str(i), str(world), str(port), str(timeout_s), str(tmp_path),
                          tb.mgmt_addr(0)], stdout=subprocess.PIPE, stderr=open(tmp_path / f"err-{i}.txt", "w"),
                      text=True, env=env) for i in range(world)]
    try:
        for i, p in enumerate(procs):
            line = p.stdout.readline()
            assert line and json.loads(line) == {"ready": i}, (line, (tmp_path / f"err-{i}.txt").read_text()[-3000:])
        cut_at = time.time()  # (before the commands: the library may act before `ip` returns)
        for rail in range(tb.rails):
            tb.cut(world - 1, rail)
        if cut_mgmt:
            tb.cut(world - 1, "mgmt")
        (tmp_path / "cut").write_text("")
        outs = []
        for i, p in enumerate(procs):
            try:
                so, _ = p.communicate(timeout=timeout_s + 60)
            except subprocess.TimeoutExpired:
                p.kill()
                so, _ = p.communicate()
            lines = [ln for ln in so.splitlines() if ln.startswith("{")]
            assert lines, (i, p.returncode, (tmp_path / f"err-{i}.txt").read_text()[-4000:])
            outs.append(json.loads(lines[-1]))
        print("after the cut:", [(o["rank"], o["first"], round(o["first_at"] - cut_at, 2), o.get("shrink_s"))
                                 for o in outs])
        return cut_at, outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _survivors_went_on(outs, world):
    for o in outs[:-1]:
        assert o["new_size"] == world - 1 and o["new_rank"] == o["rank"], o
        assert o["sum_ok"] and o["gather_ok"], o
        assert o["shrink_s"] < 1.0, o


def test_a_host_cut_off_from_every_rail_fails_calls_within_the_group_timeout_and_is_shrunk_away(
        testbed_factory, tmp_path):
    tb = testbed_factory(3, 2)
    timeout_s = 4.0
    cut_at, outs = _run(tb, tmp_path, timeout_s, cut_mgmt=False)
    world = tb.hosts
    for o in outs[:-1]:
        # a typed error naming the host, within torch's timeout (it caps the 1800 s no-path deadline)
        assert o["first"] == "LinkFailure" and o["first_peer"] == world - 1, o
        assert o["first_at"] - cut_at <= timeout_s + 1.5, (o["first_at"] - cut_at, o)
        # then past the deadline: every collective fails at once, naming it
        assert o["again"] in ("LinkFailure",) and o["again_peer"] == world - 1 and o["again_s"] < 1.0, o
    # calls among the others go on
    assert outs[0]["p2p"] == "sent" and outs[1]["p2p"] == "ok", outs
    _survivors_went_on(outs, world)
    cut = outs[-1]
    assert cut["first"] == "LinkFailure" and cut["first_at"] - cut_at <= timeout_s + 1.5, cut
    assert cut["second"] not in ("result", None) and cut["second_at"] - cut["first_at"] <= timeout_s + 1.5, cut


def test_a_host_cut_off_from_every_rail_and_the_store_is_named_lost_within_5s(testbed_factory, tmp_path):
    tb = testbed_factory(3, 2)
    timeout_s = 12.0  # far above 5 s: what names the host is liveness, not the timeout
    cut_at, outs = _run(tb, tmp_path, timeout_s, cut_mgmt=True)
    world = tb.hosts
    for o in outs[:-1]:
        assert o["first"] == "PeerLost" and o["first_peer"] == world - 1, o
        assert o["first_at"] - cut_at < 5.0, (o["first_at"] - cut_at, o)
    _survivors_went_on(outs, world)
    cut = outs[-1]
    assert cut["first"] not in ("result", None) and cut["first_at"] - cut_at <= timeout_s + 1.5, cut
