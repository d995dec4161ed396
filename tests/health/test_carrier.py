"""Tests of the netlink carrier watcher: parsing on captured/constructed
messages, and the real kernel path with a veth pair across a namespace."""

from __future__ import annotations

import base64
import json
import os
import queue
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from linkescape.health import carrier
from linkescape.health.carrier import (
    IFF_LOWER_UP, IFF_RUNNING, IFF_UP, RTM_DELLINK, RTM_NEWLINK,
    CarrierEvent, CarrierMonitor, address_for_ifname, ifname_for_address, parse_link_messages,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")

# One RTM_NEWLINK datagram captured from the kernel (6.18) for the namespaced
# end "lexb" (ifindex 2) of a veth pair right after its peer was set down:
# flags = IFF_UP|IFF_BROADCAST|IFF_MULTICAST (no RUNNING/LOWER_UP), operstate
# LOWERLAYERDOWN (3). 1496 bytes, zlib + base64.
CAPTURED_VETH_DOWN = zlib.decompress(base64.b64decode(
    "eNrVU7tKA1EQPXc36yYhapSAoPhC0YiFwYhFjG9tgo2NiFUQVyxEEYxYWGynhR+RX/A79AMs/ACxsLKwkTgzOzExrCYggh7Y"
    "PXf3zp17Zu659w6QRD0MLHrb+jMGG4fe+S6Po2jHow04tIKIuEtiHKwimI/gwWGexpp8Z1GpMPfp/IDyvPKg7BVFWuMmZP8o"
    "csqLykvKc3ituMR5jV/RPEOSx8Gwfo/gVngKnnAG+8Rtoop5XXWPC8cpd8F9u+kv8Nii3AzgDj1UUbUrAYo62MH/wh5cqcVo"
    "Db+hP4FJ6qkl4yS6yTsGZ97pQXAmjngmQd0/Oj4peSUPGbsX1xR/9dHdWq/rn/r+/xRJOnL2cCM4f9mKk07ZyU+RXvZA9hK4"
    "2ArWvGht7Eb2eaNOdk25s5bfz8Xgbxqpe9uq3bP6NcWnr7WaEN3mi/mw/vjPs9/OC9TgXCvrb4ybMTbGPocibUJTNK2jyht/"
    "7G5EmvSoWm+ruvPkcbeFMw1DKmSlQ65kjKKjhVoW/AiW/XchY0Pz"))

UP_FLAGS = IFF_UP | IFF_RUNNING | IFF_LOWER_UP


def nlmsg(mtype: int, index: int, flags: int, name: str | None, seq: int = 0) -> bytes:
    """Build an RTM_NEWLINK/RTM_DELLINK as the kernel would (minus most attributes)."""
    attrs = b""
    # an unrelated attribute first (IFLA_MTU), to exercise the attribute walk
    attrs += struct.pack("=HHI", 8, 4, 1500)
    if name is not None:
        raw = name.encode() + b"\0"
        attrs += struct.pack("=HH", 4 + len(raw), 3) + raw + b"\0" * (-(4 + len(raw)) % 4)
    attrs += struct.pack("=HHB3x", 5, 16, 6)  # IFLA_OPERSTATE = UP, padded
    body = struct.pack("=BxHiII", 0, 1, index, flags, 0xFFFFFFFF) + attrs
    return struct.pack("=IHHII", 16 + len(body), mtype, 0, seq, 0) + body


# ----------------------------------------------------------------- parsing
def test_parse_captured_kernel_message():
    msgs = parse_link_messages(CAPTURED_VETH_DOWN)
    assert len(msgs) == 1
    m = msgs[0]
    assert (m.msg_type, m.index, m.ifname, m.operstate) == (RTM_NEWLINK, 2, "lexb", 3)
    assert m.flags & IFF_UP and not m.flags & IFF_LOWER_UP
    assert m.up is False


def test_parse_constructed_messages():
    data = (nlmsg(RTM_NEWLINK, 5, UP_FLAGS, "rail0")
            + nlmsg(RTM_NEWLINK, 6, IFF_UP | IFF_LOWER_UP, "rail1")   # carrier, not yet RUNNING
            + nlmsg(RTM_NEWLINK, 7, IFF_UP | IFF_RUNNING, "rail2")    # RUNNING without LOWER_UP
            + nlmsg(RTM_DELLINK, 8, UP_FLAGS, "rail3")
            + nlmsg(20, 9, 0, "addrmsg"))                              # RTM_NEWADDR: skipped
    msgs = parse_link_messages(data)
    assert [(m.index, m.ifname, m.up) for m in msgs] == [
        (5, "rail0", True), (6, "rail1", False), (7, "rail2", False), (8, "rail3", False)]
    assert msgs[0].operstate == 6


def test_parse_truncated_datagram_keeps_complete_messages():
    data = nlmsg(RTM_NEWLINK, 5, UP_FLAGS, "rail0") + nlmsg(RTM_NEWLINK, 6, UP_FLAGS, "rail1")
    msgs = parse_link_messages(data[:-10])
    assert [m.ifname for m in msgs] == ["rail0"]
    assert parse_link_messages(b"") == []
    assert parse_link_messages(b"\x01\x00\x00\x00" * 4) == []  # length below the header size


# ---------------------------------------------- monitor logic on fed messages
@pytest.fixture
def fake_monitor():
    # names that do not exist: initial state is down, kernel messages for real
    # interfaces are never reported
    mon = CarrierMonitor(["lecfake0", "lecfake1"])
    yield mon
    mon.close()


def test_monitor_reports_only_changes_of_watched(fake_monitor):
    mon = fake_monitor
    assert not mon.is_up("lecfake0") and not mon.is_up("lecfake1") and not mon.is_up("other")
    evs = mon._feed(nlmsg(RTM_NEWLINK, 50, UP_FLAGS, "lecfake0") + nlmsg(RTM_NEWLINK, 51, UP_FLAGS, "other"))
    assert [(e.ifname, e.up) for e in evs] == [("lecfake0", True)]
    assert isinstance(evs[0], CarrierEvent) and evs[0].ts > 0 and evs[0].monotonic > 0
    assert mon.is_up("lecfake0")
    # the same state again (e.g. an MTU change) is not a change
    assert mon._feed(nlmsg(RTM_NEWLINK, 50, UP_FLAGS, "lecfake0")) == []
    # lost LOWER_UP: down
    evs = mon._feed(nlmsg(RTM_NEWLINK, 50, IFF_UP | IFF_RUNNING, "lecfake0"))
    assert [(e.ifname, e.up) for e in evs] == [("lecfake0", False)]
    # up again, then deleted: down
    mon._feed(nlmsg(RTM_NEWLINK, 50, UP_FLAGS, "lecfake0"))
    evs = mon._feed(nlmsg(RTM_DELLINK, 50, UP_FLAGS, "lecfake0"))
    assert [(e.ifname, e.up) for e in evs] == [("lecfake0", False)]


def test_monitor_rename_counts_as_down(fake_monitor):
    mon = fake_monitor
    mon._feed(nlmsg(RTM_NEWLINK, 60, UP_FLAGS, "lecfake1"))
    assert mon.is_up("lecfake1")
    evs = mon._feed(nlmsg(RTM_NEWLINK, 60, UP_FLAGS, "renamed"))
    assert [(e.ifname, e.up) for e in evs] == [("lecfake1", False)]


def test_monitor_poll_does_not_block(fake_monitor):
    t0 = time.monotonic()
    # other links may change meanwhile; none of them is reported
    assert fake_monitor.poll() == []
    assert time.monotonic() - t0 < 0.5
    fake_monitor.close()
    assert fake_monitor.poll() == []


def test_address_lookups():
    assert ifname_for_address("127.0.0.1") == "lo"
    assert ifname_for_address("127.1.2.3") == "lo"
    assert ifname_for_address("::1") == "lo"
    assert ifname_for_address("not an address") is None
    assert ifname_for_address("198.19.255.254") is None  # not configured anywhere here
    assert address_for_ifname("lecnosuchif") is None
    lo = address_for_ifname("lo")
    if lo is not None:
        assert lo.startswith("127.")
    # every configured address maps back to its interface
    for a in carrier.dump_addrs():
        if a.address and not a.address.startswith("127."):
            assert ifname_for_address(a.address) == socket.if_indextoname(a.index)


# ------------------------------------------------------------- real kernel
NS_SCRIPT = r"""
import json, select, sys
from linkescape.health.carrier import CarrierMonitor, ifname_for_address, address_for_ifname
name, addr = sys.argv[1], sys.argv[2]
mon = CarrierMonitor([name])
print(json.dumps({"ready": True, "up": mon.is_up(name), "ifname": ifname_for_address(addr),
                  "address": address_for_ifname(name), "lo": ifname_for_address("127.0.0.1")}), flush=True)
p = select.poll()
p.register(mon.fileno(), select.POLLIN)
p.register(0, select.POLLIN)  # the test closes our stdin to stop us
while True:
    for fd, _ in p.poll():
        if fd == 0:
            sys.exit(0)
    for ev in mon.poll():
        print(json.dumps({"ifname": ev.ifname, "up": ev.up, "ts": ev.ts}), flush=True)
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 to create network namespaces and veth")


@pytest.fixture
def veth_ns():
    """A namespace holding one end of a veth pair; the other end stays here.

    Both are removed whatever happens: deleting the namespace destroys its
    veth end and with it the pair; the explicit delete covers a failure
    before the move into the namespace.
    """
    tag = secrets.token_hex(4)
    ns, root_end, ns_end = f"lec{tag}", f"lecr{tag[:6]}", f"lecn{tag[:6]}"
    addr = f"198.18.{secrets.randbelow(256)}.{1 + secrets.randbelow(250)}"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ns_end)
        _ip("-n", ns, "link", "set", ns_end, "up")
        _ip("link", "set", root_end, "up")
        deadline = time.monotonic() + 5
        while "LOWER_UP" not in _ip("-n", ns, "-o", "link", "show", "dev", ns_end).stdout:
            assert time.monotonic() < deadline, "veth never got carrier"
            time.sleep(0.01)
        yield ns, root_end, ns_end, addr
    finally:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", root_end, check=False)


def _reader(proc: subprocess.Popen) -> "queue.Queue":
    q: "queue.Queue" = queue.Queue()

    def run() -> None:
        for line in proc.stdout:
            q.put(json.loads(line))
        q.put(None)

    threading.Thread(target=run, daemon=True).start()
    return q


@needs_root
@pytest.mark.testbed
def test_carrier_events_from_kernel(veth_ns, record_property):
    ns, root_end, ns_end, addr = veth_ns
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", NS_SCRIPT, ns_end, addr],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = _reader(proc)
        ready = lines.get(timeout=30)
        assert ready == {"ready": True, "up": True, "ifname": ns_end, "address": addr, "lo": "lo"}

        seen, latencies = [], []
        for cycle in range(3):
            for state in ("down", "up"):
                t0 = time.time()
                _ip("link", "set", root_end, state)
                t1 = time.time()
                ev = lines.get(timeout=10)
                assert ev is not None, "watcher exited"
                seen.append((ev["ifname"], ev["up"]))
                latencies.append((state, (ev["ts"] - t0) * 1e3, (ev["ts"] - t1) * 1e3))
        assert seen == [(ns_end, False), (ns_end, True)] * 3

        # deleting the pair from the root side removes the namespaced end: down
        _ip("link", "del", root_end)
        ev = lines.get(timeout=10)
        assert (ev["ifname"], ev["up"]) == (ns_end, False)

        # latency from starting `ip link set` (and from its exit) to the event
        # being read in the namespace; reported, not asserted
        report = ", ".join(f"{s}: {a:.2f}ms/{b:+.2f}ms" for s, a, b in latencies)
        record_property("carrier_latency_ms", report)
        print(f"\ncarrier latency (from ip start / from ip exit): {report}")
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_lost_notifications_trigger_resync():
    """On ENOBUFS (notifications dropped) the monitor re-reads the state."""
    import errno

    actual = {m.ifname: m.up for m in carrier.dump_links()}["lo"]
    mon = CarrierMonitor(["lo"])
    real = mon._sock

    class Overflowed:
        calls = 0

        def recv_into(self, buf):
            Overflowed.calls += 1
            if Overflowed.calls == 1:
                raise OSError(errno.ENOBUFS, "No buffer space available")
            raise BlockingIOError

    try:
        mon._state["lo"] = not actual  # pretend we missed a change
        mon._sock = Overflowed()
        evs = mon.poll()
        assert [(e.ifname, e.up) for e in evs] == [("lo", actual)]
        assert mon.is_up("lo") == actual
    finally:
        mon._sock = real
        mon.close()
