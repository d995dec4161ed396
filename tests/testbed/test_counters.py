"""The NIC sampler (linkescape.testbed.counters / .sampler): one process for the failover benchmark and the
demo, followed live or read at the end. Runs on loopback's counters: no testbed needed."""

from __future__ import annotations

import os
import time

from linkescape.testbed.counters import Counters, NicSampler


class _Loopback:
    """A stand-in testbed whose every NIC is ``lo``."""

    hosts, rails = 2, 2

    def root_veth(self, i, r):
        return "lo"

    def netns(self, i):  # pragma: no cover - watch=False
        raise AssertionError


def test_the_sampler_is_followed_live_and_read_whole_at_the_end(tmp_path):
    s = NicSampler(_Loopback(), interval=0.01, watch=False, directions=("tx",), flush=0.02).start()
    try:
        deadline = time.time() + 10
        while len(s.series()) < 5 and time.time() < deadline:
            time.sleep(0.02)
        live = s.series()
        assert len(live) >= 5  # written out as it goes (--flush), not only every 200 samples
        t, per_host = live[-1]
        assert len(per_host) == 2 and all(len(rails) == 2 for rails in per_host)
        assert all(isinstance(v, int) for rails in per_host for v in rails)
        workdir = os.path.dirname(s.path)
    finally:
        counters = s.stop()
    assert isinstance(counters, Counters) and set(counters.cols) == {(h, r, "tx") for h in range(2) for r in range(2)}
    assert len(counters.t) >= len(live) and s.series()[: len(live)] == live
    assert not os.path.exists(workdir)  # its own temporary files are gone
    assert s.kernel_events() == []


def test_a_benchmark_keeps_its_files_and_gets_both_directions(tmp_path):
    s = NicSampler(_Loopback(), str(tmp_path), interval=0.005, watch=False).start()
    try:
        time.sleep(0.1)
    finally:
        counters = s.stop()
        s.close()
    assert (tmp_path / "counters.txt").exists()
    assert {k[2] for k in counters.cols} == {"tx", "rx"} and len(counters.t) > 3
    tx = counters.series(0, [0, 1], "tx")
    assert (tx[1:] >= tx[:-1]).all()  # cumulative
