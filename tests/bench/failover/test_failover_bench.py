"""The failover benchmark (``linkescape bench --faults``): a small real run on the testbed, and its helpers.

The testbed runs are small (2 hosts x 2 rails, 2 faults of each kind) and check
that the report is well formed and sane: detection after the fault, the peer
side after the faulty host for a cut, no wrong results, no hangs. They hold
no timing targets: the benchmark itself reports those.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from linkescape.bench import failover as fo
from linkescape.testbed.sampler import parse_netlink
from linkescape.testbed.pytest_fixtures import require_nft, require_testbed

SHORT = dict(baseline_s=0.6, hold_s=0.6, after_detect_s=0.3, size=4 << 20)


# ----------------------------------------------------------------- helpers
def test_parse_rate_units():
    assert fo.parse_rate("1gbit") == 1e9
    assert fo.parse_rate("100mbit") == 1e8
    assert fo.parse_rate("125mbps") == 1e9
    assert fo.parse_rate("2.5gbit") == 2.5e9
    with pytest.raises(ValueError):
        fo.parse_rate("fast")
    with pytest.raises(ValueError):
        fo.parse_rate("1 parsec")


def test_summarize_counts_missing_and_percentiles():
    s = fo.summarize([1.0, None, 3.0, 2.0])
    assert s["n"] == 3 and s["missing"] == 1
    assert s["median"] == 2.0 and s["max"] == 3.0 and 2.9 < s["p99"] <= 3.0
    empty = fo.summarize([None])
    assert empty["n"] == 0 and empty["median"] is None and empty["missing"] == 1


def _counters(t, cum):
    return fo.Counters(np.asarray(t, float), {(0, 0, "tx"): np.asarray(cum, float)})


def test_counters_first_window_at_rate():
    # 1 Gbit/s until t=1, nothing until t=1.1, then 1 Gbit/s again; samples every 5 ms.
    t = np.arange(0, 2, 0.005)
    rate = np.where((t >= 1.0) & (t < 1.1), 0.0, 1e9 / 8)
    cum = np.concatenate(([0.0], np.cumsum(rate[:-1] * 0.005)))
    c = _counters(t, cum)
    series = c.series(0, [0], "tx")
    r = c.rates(series, np.array([0.5]), 0.02)[0]
    assert math.isclose(r, 1e9, rel_tol=1e-6)
    hit = c.first_at_or_above(series, 1.0, 1.9, 0.9e9, 0.02)
    assert hit is not None and 1.098 <= hit <= 1.101
    assert c.first_at_or_above(series, 1.0, 1.05, 0.9e9, 0.02) is None
    stalls = fo.find_stalls(c, [0], 1e9, 0.0, 2.0, step=0.01, min_s=0.05)
    assert len(stalls) == 1 and 0.99 <= stalls[0][0] <= 1.01 and 1.09 <= stalls[0][1] <= 1.11


def test_busbw_from_completion_times():
    dones = [{"t": 10.0 + 0.1 * k} for k in range(30)]
    bw = fo.busbw_from_dones(dones, 1 << 20, 4, skip_s=0.0)
    assert math.isclose(bw, 2 * 3 / 4 * (1 << 20) * 8 / 0.1, rel_tol=1e-9)
    assert fo.busbw_from_dones(dones[:2], 1 << 20, 4) is None


def test_kernel_time_picks_the_right_event():
    ev = [{"t": 1.0, "netns": "x-h0", "what": "carrier", "name": "r0", "up": False},
          {"t": 2.0, "netns": "x-h0", "what": "carrier", "name": "r0", "up": True},
          {"t": 3.0, "netns": "x-h1", "what": "newchain", "name": "le_bh_r0", "up": None},
          {"t": 4.0, "netns": "x-h1", "what": "delchain", "name": "le_bh_r0", "up": None}]
    assert fo.kernel_time(ev, "x-h0", "r0", "cut", True, 0.5, 1.5) == 1.0
    assert fo.kernel_time(ev, "x-h0", "r0", "cut", False, 0.5, 2.5) == 2.0
    assert fo.kernel_time(ev, "x-h1", "r0", "blackhole", True, 0.0, 9.0) == 3.0
    assert fo.kernel_time(ev, "x-h1", "r0", "blackhole", False, 0.0, 9.0) == 4.0
    assert fo.kernel_time(ev, "x-h0", "r1", "cut", True, 0.0, 9.0) is None


def test_parse_netlink_link_message():
    import struct

    name = b"r0\0\0"
    attr = struct.pack("=HH", 4 + 3, 3) + name  # IFLA_IFNAME, padded to 4
    body = struct.pack("=BxHiII", 0, 1, 5, 0x1 | 0x40, 0) + attr  # UP|RUNNING, no LOWER_UP
    msg = struct.pack("=IHHII", 16 + len(body), 16, 0, 0, 0) + body
    assert parse_netlink("link", msg) == [("carrier", "r0", False)]


def test_cli_options_and_rails_count():
    import click
    from click.testing import CliRunner

    assert fo.rails_count("3") == 3 and fo.rails_count("127.0.0.1") == 2

    @click.command()
    @fo.add_failover_options
    def cmd(**kw):
        click.echo(json.dumps(kw, sort_keys=True))

    out = CliRunner().invoke(cmd, ["--fault-count", "3", "--hosts", "2", "--rate", "100mbit", "--no-mptcp"])
    assert out.exit_code == 0, out.output
    kw = json.loads(out.output)
    assert kw["fault_count"] == 3 and kw["hosts"] == 2 and kw["rate"] == "100mbit" and kw["mptcp"] is False
    res = CliRunner().invoke(fo.failover, ["--faults", "cut,nonsense"])
    assert res.exit_code != 0 and "nonsense" in res.output


def test_peer_detection_is_split_by_whether_the_pair_exchanges_data():
    from linkescape.bench.failover import analysis

    gb, kb = 3 << 30, 40 << 10
    # recursive halving on 4 ranks: 0-1, 0-2, 1-3, 2-3 carry the data; 0-3 and 1-2 probes only
    busy = {(0, 1), (0, 2), (1, 3), (2, 3)}
    pair_bytes = {r: {p: (gb if (min(r, p), max(r, p)) in busy else kb) for p in range(4) if p != r}
                  for r in range(4)}
    pair_bytes[3][0] = 0  # one end's count missing: the other end's counts
    pairs = analysis.data_pairs(pair_bytes, 4)
    assert pairs == {frozenset(p) for p in busy}
    assert analysis.data_pairs({}, 4) is None and analysis.data_pairs({0: {}, 1: {}}, 2) is None

    class F:
        rank, others, t_cmd, t_rcmd, t_fault, t_eff = 0, [1, 2, 3], 10.0, 20.0, 10.0, 10.0

    events = {p: [{"ts": 10.0 + d, "event": "failover", "peer": 0, "rail": 0}] for p, d in
              ((1, 0.19), (2, 0.2), (3, 0.41))}
    out = analysis._peer_detection(events, F, 190.0, pairs)
    assert set(out["peer_data_ms"]) == {1, 2} and set(out["peer_idle_ms"]) == {3}
    assert out["peer_idle_ms"][3] == pytest.approx(410.0)
    assert set(analysis._peer_detection(events, F, 190.0, None)["peer_data_ms"]) == {1, 2, 3}


# ----------------------------------------------------------------- testbed
def _check_series(s, kind, count):
    assert s["faults"] == count
    assert s["wrong"] == 0 and s["wrong_iters"] == 0, s
    assert s["hangs"] == 0 and not s["errors"], s["errors"]
    assert all(n > 0 for n in s["iters"].values())
    for f in s["per_fault"]:
        # every fault was detected on both sides, after the fault command started
        assert f["local_cmd_ms"] is not None and f["local_cmd_ms"] > 0, f
        assert all(v is not None for v in f["peer_ms"].values()), f
        assert f["peer_data_ms"] == f["peer_ms"] and not f["peer_idle_ms"], f  # 2 hosts: the one pair is busy
        assert f["failback_local_ms"] is not None and f["failback_local_ms"] > 0, f
        if kind == "cut":
            # the peer learns of a cut from the faulty host, which tells it first and then
            # fails over itself: the two happen within a few milliseconds, in either order
            assert all(d >= -5.0 for d in f["peer_minus_local_ms"].values()), f
            assert f["causes"].get("local", {}).get("carrier"), f
        else:
            assert f["local_ms"] > 50, f  # a blackhole is only seen by silence
    sm = s["summary"]
    for key in ("detect_local_ms", "detect_peer_ms", "failback_local_ms"):
        assert sm[key]["n"] >= 1 and sm[key]["median"] is not None
        assert sm[key]["median"] <= sm[key]["p99"] <= sm[key]["max"]


@pytest.mark.testbed
@pytest.mark.timeout(240)
def test_small_failover_bench(tmp_path):
    require_testbed()
    require_nft()
    out = tmp_path / "failover.json"
    result = fo.run_failover_bench(("cut", "blackhole"), count=2, hosts=2, rails=2, rate="1gbit",
                                   json_path=str(out), overhead_repeats=1, overhead_seconds=2.0, mptcp=False,
                                   log=lambda s: None, **SHORT)
    on_disk = json.loads(out.read_text())
    assert set(on_disk["series"]) == {"cut", "blackhole"}
    for kind in ("cut", "blackhole"):
        _check_series(result["series"][kind], kind, 2)
    ov = result["overhead"]
    assert ov["wrong"] == 0 and ov["hangs"] == 0 and not ov["errors"]
    assert ov["backup_gbps"]["n"] == 1 and ov["single_gbps"]["n"] == 1
    assert fo.ok(result)
    text = fo.format_report(result)
    assert "## cut" in text and "## blackhole" in text and "healthy busbw" in text
    assert "detection, local" in text and "targets:" in text


@pytest.mark.testbed
@pytest.mark.timeout(240)
def test_mptcp_comparison_small():
    require_testbed()
    st = fo.Settings(count=1, hosts=2, rails=2, mptcp_trials=1, **SHORT)
    res = fo.run_mptcp_comparison(st, log=lambda s: None)
    assert len(res) == 1
    (cc, m), = res.items()
    assert cc
    trial = m["mptcp"]["trials"][0]
    assert trial["baseline_gbps"] > 0.1  # the MPTCP transfer really ran before the cut
    assert trial["client"].startswith("connected")
    le = m["linkescape"]
    assert le["wrong"] == 0 and le["hangs"] == 0 and not le["errors"]
    assert le["per_fault"] and le["per_fault"][0]["local_cmd_ms"] > 0


@pytest.mark.testbed
@pytest.mark.timeout(240)
def test_a_flap_series_with_the_jobs_rate_and_carrier_detection():
    require_testbed()
    result = fo.run_failover_bench(("flap",), count=2, hosts=2, rails=2, rate="1gbit", overhead_repeats=0,
                                   mptcp=False, log=lambda s: None, flap_period_s=0.4, flap_cycles=3, **SHORT)
    s = result["series"]["flap"]
    assert s["faults"] == 2 and s["wrong"] == 0 and s["hangs"] == 0 and not s["errors"], s["errors"]
    for f in s["per_fault"]:
        assert f["causes"].get("local", {}).get("carrier"), f  # a flap is a carrier loss, again and again
        assert f["failback_local_ms"] is not None and f["failback_local_ms"] > 0, f
        # the sampler heard the kernel's carrier loss, and the rank's link_down followed it
        assert f["carrier_to_link_down_ms"] is not None and f["carrier_to_link_down_ms"] > -5.0, f
        assert f["rate_before_ops"] and f["rate_during_ops"] is not None and f["rate_ratio"] > 0, f
    sm = s["summary"]
    assert sm["carrier_to_link_down_ms"]["n"] == 2 and sm["rate_ratio"]["n"] == 2
    text = fo.format_report(result)
    assert "local carrier event -> link_down" in text and "job rate during the fault" in text


def test_idle_links_never_found_are_a_miss_not_unmeasured():
    from linkescape.bench.failover.report import verdict

    def summ(vals):
        return fo.summarize(vals)

    def series(data, idle):
        sm = {k: summ([1.0]) for k in ("detect_local_ms", "detect_peer_ms", "restore90_after_detect_ms")}
        sm["detect_peer_data_ms"], sm["detect_peer_idle_ms"] = summ(data), summ(idle)
        return {"summary": sm, "wrong": 0, "hangs": 0, "errors": [], "unexplained_events": []}

    v = verdict({"series": {"blackhole": series([190.0, 195.0], [None, None])}})
    assert v["blackhole_peer_p99"] is True and v["blackhole_peer_idle_p99"] is False
    v = verdict({"series": {"blackhole": series([None], [400.0])}})
    assert v["blackhole_peer_p99"] is False and v["blackhole_peer_idle_p99"] is True
    v = verdict({"series": {"cut": series([1.0], [])}})
    assert "cut_peer_idle_p99" not in v  # no idle pair: nothing to judge
