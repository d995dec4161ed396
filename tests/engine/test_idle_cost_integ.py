"""An idle job costs next to nothing, whatever its size: no periodic work per
link or per peer (frames and wake-ups of an idle 16-rank job), and at most
one store call per rank per second (a counting store wrapper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "idle_worker.py")


def run_idle(world: int, seconds: float, env_extra=None) -> list:
    from linkescape.torch.testing import reserved_port

    with reserved_port() as port:  # rank 0's TCPStore listens on it
        return _run_idle(world, seconds, port, env_extra)


def _run_idle(world: int, seconds: float, port: int, env_extra) -> list:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", OMP_NUM_THREADS="1", **(env_extra or {}))
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(port), str(seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120 + seconds)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def test_an_idle_16_rank_job_does_no_periodic_work_per_link():
    seconds = 5.0
    ranks = run_idle(16, seconds)
    rate = 10.0  # the default probe budget (LINKESCAPE_PROBE_RATE)
    for r in ranks:
        assert r["links"] == 30
        # With a heartbeat on every link (before), a rank sent 20 frames a
        # second per link: 3000 in 5 s here. The probe budget bounds it by
        # the rate, whatever the number of links.
        assert r["frames_sent"] <= rate * r["seconds"] + 5, r
        # what it receives is its peers' probes: on average as many
        assert r["frames_received"] <= 3 * rate * r["seconds"], r
        # wakes only when something is due: a probe (and the peer kernel's
        # reply to it), a probe of a peer, a beat
        assert r["wakeups"]["engine"] <= 8 * rate * r["seconds"], r
        assert r["wakeups"]["recovery"] <= 2, r  # nothing is down: it sleeps
        assert r["wakeups"]["beacon"] <= r["seconds"] + 2, r
    total_in = sum(r["frames_received"] for r in ranks)
    total_out = sum(r["frames_sent"] for r in ranks)
    assert total_in == pytest.approx(total_out, abs=len(ranks) * 2)  # every probe arrived
    assert total_out >= len(ranks) * rate * seconds * 0.5  # and the idle links are being probed


def test_a_healthy_job_makes_at_most_one_store_call_per_rank_per_second():
    seconds = 8.0
    ranks = run_idle(4, seconds)
    for r in ranks:
        assert r["store_calls"] <= r["seconds"] + 1, r
