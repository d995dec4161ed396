"""Faults really cut, blackhole and flap links, and restore really repairs them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from linkescape.testbed import faults
from linkescape.testbed.netns import TestbedError, find_leftovers
from linkescape.testbed.probe import tcp_check
from linkescape.testbed.pytest_fixtures import require_nft, testbed, testbed_factory  # noqa: F401

pytestmark = pytest.mark.testbed

T = 0.8  # connect timeout for probes that are expected to fail


def _carrier(tb, i, nic):
    """The kernel's own view from inside the host: /sys/class/net/NIC/carrier."""
    return tb.exec(i, ["cat", f"/sys/class/net/{nic}/carrier"], capture_output=True, text=True).stdout.strip()


def _rx_packets(tb, i, nic):
    return int(tb.exec(i, ["cat", f"/sys/class/net/{nic}/statistics/rx_packets"],
                       capture_output=True, text=True).stdout)


def test_cut_drops_carrier_and_traffic_restore_repairs(testbed):
    tb = testbed
    assert _carrier(tb, 0, "r1") == "1"
    before = time.time()
    ts = tb.cut(0, 1)
    assert before <= ts <= time.time()
    st = tb.link_state(0, 1)
    assert st.cut and not st.carrier and st.admin_up and not st.usable
    assert _carrier(tb, 0, "r1") == "0"
    flags = tb.exec(0, ["ip", "-br", "link", "show", "r1"], capture_output=True, text=True).stdout
    assert "NO-CARRIER" in flags and "LOWER_UP" not in flags
    assert not tcp_check(tb, 0, 1, 1, timeout=T)
    assert not tcp_check(tb, 1, 0, 1, timeout=T)
    assert tcp_check(tb, 0, 1, 0) and tcp_check(tb, 0, 1, "mgmt")  # the other rails keep working
    assert tb.link_state(1, 1).carrier  # only host 0's NIC lost carrier
    tb.restore(0, 1)
    tb.restore(0, 1)  # idempotent
    assert _carrier(tb, 0, "r1") == "1" and tb.link_state(0, 1).usable
    assert tcp_check(tb, 0, 1, 1) and tcp_check(tb, 1, 0, 1)


def test_blackhole_keeps_carrier_but_drops_both_ways(testbed):
    require_nft()
    tb = testbed
    ev = faults.blackhole(tb, 1, 0)
    assert ev.fault == "blackhole" and ev.host == 1 and ev.rail == 0
    st = tb.link_state(1, 0)
    assert st.blackholed and st.carrier and st.admin_up and not st.cut and not st.usable
    assert _carrier(tb, 1, "r0") == "1"
    assert not tcp_check(tb, 0, 1, 0, timeout=T)  # into the blackholed host
    assert not tcp_check(tb, 1, 0, 0, timeout=T)  # out of it
    assert tcp_check(tb, 0, 1, 1) and tcp_check(tb, 1, 0, "mgmt")
    tb.blackhole(1, 0)  # applying it twice is harmless
    tb.restore(1, 0)
    tb.restore(1, 0)
    assert not tb.link_state(1, 0).blackholed
    assert tcp_check(tb, 0, 1, 0) and tcp_check(tb, 1, 0, 0)


def test_blackhole_egress_hook_really_drops_outgoing_packets(testbed):
    """The egress hook alone must stop what the host sends: the peer sees nothing."""
    require_nft()
    tb = testbed
    ev = faults.blackhole(tb, 0, 0)
    if ev.extra.get("hooks") != "ingress+egress":
        pytest.skip("kernel has no netdev egress hook; the ingress fallback is tested separately")
    rx = _rx_packets(tb, 1, "r0")
    tb.exec(0, [sys.executable, "-c", "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "[s.sendto(b'x',('198.18.0.2',9)) for _ in range(20)]"], check=True)
    time.sleep(0.2)
    assert _rx_packets(tb, 1, "r0") - rx < 5  # 20 datagrams sent, none (or a stray ARP) arrived
    tb.restore(0, 0)


def test_blackhole_ingress_only_fallback(testbed, monkeypatch):
    """For kernels without the egress hook: ingress on both ends of the veth."""
    require_nft()
    monkeypatch.setenv(faults.BLACKHOLE_MODE_ENV, "ingress")
    tb = testbed
    ev = faults.blackhole(tb, 0, 1)
    assert ev.extra["hooks"] == "ingress-both-ends"
    assert tb.link_state(0, 1).blackholed and tb.link_state(0, 1).carrier
    tables = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True, text=True).stdout
    assert f"{tb.name}_bh_0_1" in tables
    assert not tcp_check(tb, 0, 1, 1, timeout=T)
    assert not tcp_check(tb, 1, 0, 1, timeout=T)
    tb.restore(0, 1)
    assert tcp_check(tb, 0, 1, 1) and tcp_check(tb, 1, 0, 1)
    faults.blackhole(tb, 0, 1)  # left in place: down must remove the root-namespace table too
    name = tb.name
    tb.down()
    tables = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True, text=True).stdout
    assert f"{name}_bh_" not in tables and find_leftovers(name) == {}


def test_flap_alternates_and_ends_up(testbed):
    tb = testbed
    evs = tb.flap(0, 0, period=0.4, count=3)
    assert [e.extra["state"] for e in evs] == ["down", "up"] * 3
    assert [e.extra["cycle"] for e in evs] == [0, 0, 1, 1, 2, 2]
    gaps = [b.ts - a.ts for a, b in zip(evs, evs[1:])]
    # ~0.2 s each half; loose, not a timing target (0.088 s once in make test's parallel part: a half
    # cut short by the one before it running late)
    assert all(0.05 < g < 0.6 for g in gaps), gaps
    assert tb.link_state(0, 0).usable
    assert tcp_check(tb, 0, 1, 0)


def test_flap_by_duration_and_in_background(testbed):
    tb = testbed
    evs = tb.flap(1, 1, period=0.2, duration=0.5)
    assert len(evs) == 6 and evs[-1].extra["state"] == "up"  # ceil(0.5 / 0.2) cycles
    with tb.flap_async(0, 1, period=10.0) as f:
        deadline = time.monotonic() + 2
        while not f.events and time.monotonic() < deadline:
            time.sleep(0.01)
        assert f.running and not tb.link_state(0, 1).carrier  # down for the first half period
    seen = f.events  # stopped while down: it must have come back up
    assert [e.extra["state"] for e in seen] == ["down", "up"]
    assert tb.link_state(0, 1).usable


def test_flap_blackhole_mode(testbed):
    require_nft()
    tb = testbed
    evs = tb.flap(0, "mgmt", period=0.2, count=1, mode="blackhole")
    assert [e.extra["state"] for e in evs] == ["down", "up"]
    assert evs[0].extra["hooks"] in ("ingress+egress", "ingress-both-ends")
    assert not tb.link_state(0, "mgmt").blackholed and tcp_check(tb, 0, 1, "mgmt")


def test_fault_arguments_are_checked(testbed):
    with pytest.raises(TestbedError):
        testbed.cut(2, 0)
    with pytest.raises(TestbedError):
        testbed.cut(0, 2)
    with pytest.raises(TestbedError):
        testbed.flap(0, 0, period=0.0, count=1)
    with pytest.raises(TestbedError):
        faults.flap(testbed, 0, 0, period=1.0)  # would never end


# ------------------------------------------------------------------ lossy and repair
_UDP_SINK = ("import socket,sys,time\n"
             "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
             "s.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,1<<22)\n"
             "s.bind((sys.argv[1],0)); print(s.getsockname()[1],flush=True)\n"
             "s.settimeout(1.5); n=0\n"
             "try:\n"
             "    while True:\n"
             "        d=s.recv(64)\n"
             "        if d==b'end': break\n"
             "        n+=1\n"
             "except socket.timeout: pass\n"
             "print(n,flush=True)\n")


def _udp_delivered(tb, src, dst, rail, count=2000):
    """Datagrams that host ``dst`` received of ``count`` that ``src`` sent to it on ``rail``."""
    sink = tb.popen(dst, [sys.executable, "-c", _UDP_SINK, tb.host_addr(dst, rail)],
                    stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        send = (f"import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                f"for i in range({count}):\n    s.sendto(b'x',('{tb.host_addr(dst, rail)}',{port}))\n"
                f"    time.sleep(0.001) if i % 20 == 0 else None  # paced: no socket-buffer drops\n"
                f"time.sleep(0.2)\n[s.sendto(b'end',('{tb.host_addr(dst, rail)}',{port})) for _ in range(30)]\n")
        tb.exec(src, [sys.executable, "-c", send], check=True)
        out, _ = sink.communicate(timeout=10)
        return int(out.split()[-1])
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()


def test_lossy_drops_a_share_of_packets_and_keeps_carrier(testbed):
    require_nft()
    tb = testbed
    assert _udp_delivered(tb, 1, 0, 0, count=500) >= 495  # clean before
    ev = faults.lossy(tb, 0, 0, loss=20)
    assert ev.fault == "lossy" and ev.extra["loss"] == 20.0
    st = tb.link_state(0, 0)
    assert st.carrier and st.usable and st.degraded and st.lossy == pytest.approx(20.0)
    assert not st.blackholed and _carrier(tb, 0, "r0") == "1"
    got = _udp_delivered(tb, 1, 0, 0)  # into the lossy NIC: its ingress drops ~20 %
    assert 0.70 * 2000 < got < 0.90 * 2000, got
    got = _udp_delivered(tb, 0, 1, 0)  # out of it: its egress drops ~20 %
    assert 0.70 * 2000 < got < 0.90 * 2000, got
    assert _udp_delivered(tb, 1, 0, 1, count=500) >= 495  # the other rail is clean
    faults.lossy(tb, 0, 0, loss=1)  # applying it again changes the share
    assert tb.link_state(0, 0).lossy == pytest.approx(1.0)
    assert tcp_check(tb, 1, 0, 0, timeout=8)  # TCP gets through: a grey failure, not a dead link
    tb.restore(0, 0)
    assert tb.link_state(0, 0).lossy is None and not tb.link_state(0, 0).degraded
    assert _udp_delivered(tb, 1, 0, 0, count=500) >= 495


def test_lossy_ingress_only_fallback(testbed, monkeypatch):
    require_nft()
    monkeypatch.setenv(faults.BLACKHOLE_MODE_ENV, "ingress")
    tb = testbed
    assert _udp_delivered(tb, 1, 0, 1, count=200) >= 198  # clean before (and the neighbours resolved)
    ev = faults.lossy(tb, 1, 1, loss=50)
    assert ev.extra["hooks"] == "ingress-both-ends"
    tables = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True, text=True).stdout
    assert f"{tb.name}_loss_1_1" in tables
    got = _udp_delivered(tb, 1, 0, 1)  # from the lossy host: dropped at the bridge-side ingress
    assert 0.35 * 2000 < got < 0.65 * 2000, got
    name = tb.name
    tb.down()  # removes the root-namespace table too
    tables = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True, text=True).stdout
    assert f"{name}_loss_" not in tables


def test_repair_undoes_one_kind_and_keeps_the_others(testbed):
    require_nft()
    tb = testbed
    tb.cut(0, 1)
    tb.blackhole(0, 1)
    tb.lossy(0, 1, 10)
    st = tb.link_state(0, 1)
    assert st.cut and st.blackholed and st.lossy == pytest.approx(10.0)
    ev = faults.repair(tb, 0, 1, "cut")
    assert ev.fault == "repair" and ev.extra == {"kind": "cut"}
    st = tb.link_state(0, 1)
    assert not st.cut and st.carrier and st.blackholed and st.lossy is not None and not st.usable
    assert not tcp_check(tb, 0, 1, 1, timeout=T)  # still blackholed
    tb.repair(0, 1, "blackhole")
    st = tb.link_state(0, 1)
    assert st.usable and st.degraded
    tb.repair(0, 1, "lossy")
    tb.repair(0, 1, "lossy")  # idempotent
    assert tb.link_state(0, 1).usable and not tb.link_state(0, 1).degraded
    assert tcp_check(tb, 0, 1, 1)


def test_flap_does_not_undo_another_fault_on_the_rail(testbed):
    require_nft()
    tb = testbed
    tb.blackhole(0, 0)
    tb.flap(0, 0, period=0.2, count=1, mode="cut")
    st = tb.link_state(0, 0)
    assert st.carrier and not st.cut and st.blackholed  # the flap ended up, the blackhole stays
    tb.restore(0, 0)


def test_lossy_arguments_are_checked(testbed):
    require_nft()
    for bad in (0, -1, 101, "x"):
        with pytest.raises(TestbedError):
            faults.lossy(testbed, 0, 0, loss=bad)
    with pytest.raises(TestbedError):
        faults.repair(testbed, 0, 0, "flap")
    assert not testbed.link_state(0, 0).degraded
