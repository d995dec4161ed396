"""The testbed builds real namespaces, bridges and veths, and removes all of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from linkescape.errors import LinkEscapeError
from linkescape.testbed.netns import (Testbed, TestbedError, TestbedExists, down, find_leftovers, list_netns,
                                      state_path, unique_name, validate_name)
from linkescape.testbed.probe import tcp_check, tcp_throughput
from linkescape.testbed.pytest_fixtures import require_testbed, testbed, testbed_factory  # noqa: F401


def _root_links() -> set:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {rec["ifname"] for rec in json.loads(out)}


def _addrs(tb: Testbed, i: int) -> dict:
    out = tb.exec(i, ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return {rec["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in rec.get("addr_info", [])]
            for rec in json.loads(out)}


def _owned(name: str) -> tuple:
    """Namespaces and root links that carry the testbed's prefix."""
    return ([n for n in list_netns() if n.startswith(name + "-")],
            sorted(l for l in _root_links() if l.startswith(name + "-")))


# --------------------------------------------------------------- no root needed
def test_testbed_error_is_a_linkescape_error():
    assert issubclass(TestbedError, LinkEscapeError)
    assert issubclass(TestbedExists, TestbedError)


def test_bad_names_are_rejected():
    for bad in ("", "1abc", "a-b", "a b", "x/y"):
        with pytest.raises(TestbedError):
            validate_name(bad)
    assert validate_name("le") == "le"


def test_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match="root"):
        Testbed.up(2, 2, name="nr")
    with pytest.raises(TestbedError, match="root"):
        down("nr")


def test_names_and_addresses():
    tb = Testbed(name="le", hosts=3, rails=2)
    assert tb.netns(2) == "le-h2"
    assert tb.bridge(1) == "le-b1" and tb.bridge("mgmt") == "le-bm"
    assert tb.root_veth(2, 1) == "le-2s1" and tb.root_veth(0, "mgmt") == "le-0sm"
    assert tb.host_addr(2, 1) == "198.18.1.3"
    assert tb.mgmt_addr(0) == "198.19.0.1"
    assert tb.rail_nics == ["r0", "r1"]
    with pytest.raises(TestbedError):
        tb.host_addr(3, 0)
    with pytest.raises(TestbedError):
        tb.host_addr(0, 2)


# --------------------------------------------------------------- real kernel
@pytest.mark.testbed
def test_up_creates_and_down_removes_everything():
    require_testbed()
    name = unique_name()
    fwd = open("/proc/sys/net/ipv4/ip_forward").read()
    tb = Testbed.up(2, 3, rate="1gbit", name=name)
    try:
        netns, links = _owned(name)
        assert netns == [f"{name}-h0", f"{name}-h1"]
        assert set(links) == {f"{name}-b0", f"{name}-b1", f"{name}-b2", f"{name}-bm"} | {
            f"{name}-{i}s{r}" for i in range(2) for r in ("0", "1", "2", "m")}
        assert max(len(l) for l in links) <= 15
        for i in range(2):
            addrs = _addrs(tb, i)
            assert addrs["lo"] == ["127.0.0.1/8"]  # lo is up
            for r in range(3):
                assert addrs[f"r{r}"] == [f"198.18.{r}.{i + 1}/24"]
            assert addrs["mgmt"] == [f"198.19.0.{i + 1}/24"]
            qdisc = tb.exec(i, ["tc", "qdisc", "show", "dev", "r2"], capture_output=True, text=True).stdout
            assert "tbf" in qdisc and "1Gbit" in qdisc
            mq = tb.exec(i, ["tc", "qdisc", "show", "dev", "mgmt"], capture_output=True, text=True).stdout
            assert "tbf" not in mq  # the front-end network is not shaped
            assert all(tb.link_state(i, r).usable for r in (0, 1, 2, "mgmt"))
        state = json.load(open(state_path(name)))
        assert state["hosts"] == 2 and state["rails"] == 3 and state["rate"] == "1gbit"
        assert Testbed.attach(name) == tb
        with pytest.raises(TestbedExists):
            Testbed.up(2, 3, name=name)
    finally:
        removed = tb.down()
    assert removed["netns"] == [f"{name}-h0", f"{name}-h1"]
    assert _owned(name) == ([], [])
    assert not os.path.exists(state_path(name))
    assert tb.down() == {}  # idempotent
    assert open("/proc/sys/net/ipv4/ip_forward").read() == fwd  # never touched


@pytest.mark.testbed
def test_down_and_attach_work_without_state_file():
    require_testbed()
    name = unique_name()
    tb = Testbed.up(3, 2, name=name)
    try:
        os.unlink(state_path(name))
        found = Testbed.attach(name)  # discovered from the kernel objects
        assert (found.hosts, found.rails) == (3, 2)
        # A half-dead testbed (one namespace already gone) still comes down.
        subprocess.run(["ip", "netns", "del", f"{name}-h1"], check=True)
    finally:
        down(name)
    assert _owned(name) == ([], [])
    assert find_leftovers(name) == {}


@pytest.mark.testbed
def test_replace_rebuilds(testbed_factory):
    tb = testbed_factory(2, 1)
    tb2 = Testbed.up(3, 2, name=tb.name, replace=True)
    assert _owned(tb.name)[0] == [f"{tb.name}-h{i}" for i in range(3)]
    assert tcp_check(tb2, 2, 0, 1)


@pytest.mark.testbed
def test_hosts_talk_over_every_rail_and_mgmt(testbed_factory):
    tb = testbed_factory(3, 2)
    for rail in (0, 1, "mgmt"):
        assert tcp_check(tb, 0, 1, rail), rail
        assert tcp_check(tb, 1, 0, rail), rail
        assert tcp_check(tb, 2, 0, rail), rail
    # A rail's traffic leaves through that rail's NIC (routes are per subnet).
    route = tb.exec(0, ["ip", "-j", "route", "get", tb.host_addr(1, 1)], capture_output=True, text=True).stdout
    assert json.loads(route)[0]["dev"] == "r1"
    # Nothing outside 198.18.0.0/15 is reachable from inside a host.
    routes = tb.exec(0, ["ip", "-j", "route", "show"], capture_output=True, text=True).stdout
    assert {r["dst"] for r in json.loads(routes)} == {"198.18.0.0/24", "198.18.1.0/24", "198.19.0.0/24"}


@pytest.mark.testbed
def test_rate_limits_a_tcp_stream(testbed_factory):
    tb = testbed_factory(2, 1, rate="100mbit")
    bps = tcp_throughput(tb, 0, 1, 0, seconds=2.0)
    assert 50e6 <= bps <= 120e6, f"{bps / 1e6:.1f} Mbit/s"


_FAILING_TEST = textwrap.dedent("""
    from linkescape.testbed.pytest_fixtures import testbed_factory  # noqa: F401

    def test_boom(testbed_factory):
        tb = testbed_factory(2, 2)
        open({out!r}, "w").write(tb.name)
        raise RuntimeError("the test fails while its testbed is up")
""")


@pytest.mark.testbed
def test_fixture_cleans_up_when_the_test_fails(tmp_path):
    require_testbed()
    out = tmp_path / "name"
    (tmp_path / "test_inner_fail.py").write_text(_FAILING_TEST.format(out=str(out)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tmp_path / "test_inner_fail.py")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the test fails while its testbed is up" in proc.stdout
    name = out.read_text()
    assert _owned(name) == ([], []) and find_leftovers(name) == {}


@pytest.mark.testbed
def test_atexit_cleans_up_an_abandoned_testbed(tmp_path):
    require_testbed()
    script = ("from linkescape.testbed.netns import make_temporary\n"
              "tb = make_temporary(2, 1)\nprint(tb.name, flush=True)\n"
              "raise RuntimeError('crash with the testbed up')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1 and "crash with the testbed up" in proc.stderr
    name = proc.stdout.strip()
    assert name and _owned(name) == ([], [])
