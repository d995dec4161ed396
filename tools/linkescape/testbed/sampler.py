"""The NIC-counter and kernel-event sampler: a process of its own (its handle: :class:`.counters.NicSampler`).

``python -m linkescape.testbed.sampler --out FILE --interval S [--flush S] [--watch NETNS]... FILE...``
reads the given counter files (``/sys/class/net/DEV/statistics/*_bytes``)
every ``S`` seconds and appends ``t v1 v2 ...`` lines to ``FILE`` until it is
signalled (SIGTERM/SIGINT); ``--flush`` writes them out at least that often
(for a reader that follows the file live), else every 200 samples. Run in
the root namespace it samples the bridge-side veths, i.e. what each host's
NIC really put on (or took off) the wire after the tbf shaper. With
``--watch`` it also listens to rtnetlink link events and nftables events
inside those namespaces and writes them, time stamped on arrival, to
``FILE.nl`` (JSON lines): the moment a cut (carrier loss) or a blackhole (its
nftables chains committed) really took effect, which the fault command's own
return time only bounds from above.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import List


# ----------------------------------------------------------- netlink watch
CLONE_NEWNET = 0x40000000
NETLINK_ROUTE, NETLINK_NETFILTER = 0, 12
RTMGRP_LINK = 0x1
NFNLGRP_NFTABLES = 7
RTM_NEWLINK = 16
IFF_LOWER_UP = 0x10000
IFLA_IFNAME = 3
NFNL_SUBSYS_NFTABLES = 10
_NFT_MSGS = {0: "newtable", 2: "deltable", 3: "newchain", 5: "delchain"}


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def netlink_sockets(netns: str) -> list:
    """A link-event and an nftables-event netlink socket inside ``netns`` (sockets keep their namespace)."""
    import socket

    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join("/run/netns", netns), os.O_RDONLY)
    socks = []
    try:
        _setns(target)
        link = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        link.bind((0, RTMGRP_LINK))
        socks.append(("link", link))
        try:
            nft = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            nft.bind((0, 1 << (NFNLGRP_NFTABLES - 1)))
            socks.append(("nft", nft))
        except OSError:
            pass  # no nftables in this kernel: blackhole times fall back to the command's
    finally:
        _setns(own)
        os.close(own)
        os.close(target)
    for _, s in socks:
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return socks


def _attrs(buf: bytes, off: int, end: int):
    import struct

    while off + 4 <= end:
        alen, atype = struct.unpack_from("=HH", buf, off)
        if alen < 4:
            break
        yield atype & 0x3FFF, buf[off + 4:off + alen]
        off += (alen + 3) & ~3


def parse_netlink(kind: str, data: bytes) -> list:
    """(what, name, detail) of every message: link carrier states, nftables table/chain changes."""
    import struct

    out = []
    off = 0
    while off + 16 <= len(data):
        mlen, mtype = struct.unpack_from("=IH", data, off)
        if mlen < 16:
            break
        end = off + mlen
        if kind == "link" and mtype == RTM_NEWLINK and mlen >= 32:
            flags = struct.unpack_from("=I", data, off + 16 + 8)[0]
            name = ""
            for atype, val in _attrs(data, off + 32, end):
                if atype == IFLA_IFNAME:
                    name = val.split(b"\0", 1)[0].decode(errors="replace")
            out.append(("carrier", name, bool(flags & IFF_LOWER_UP)))
        elif kind == "nft" and (mtype >> 8) == NFNL_SUBSYS_NFTABLES and (mtype & 0xFF) in _NFT_MSGS:
            name = ""
            for atype, val in _attrs(data, off + 20, end):
                if atype == 1:  # NFTA_TABLE_NAME / NFTA_CHAIN_TABLE
                    name = val.split(b"\0", 1)[0].decode(errors="replace")
                    break
            out.append((_NFT_MSGS[mtype & 0xFF], name, None))
        off += (mlen + 3) & ~3
    return out


def _kernel_events(ready: list, last_carrier: dict) -> List[str]:
    """What the ready netlink sockets say, time stamped now, as JSON lines (a carrier state only when it changed)."""
    t = time.time()
    out = []
    for ns, kind, sock in ready:
        while True:
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # ENOBUFS: events lost; carry on
                break
            for what, name, up in parse_netlink(kind, data):
                if what == "carrier":
                    if last_carrier.get((ns, name)) == up:
                        continue
                    last_carrier[(ns, name)] = up
                out.append(json.dumps({"t": t, "netns": ns, "what": what, "name": name, "up": up}))
    return out


def run_sampler(args) -> int:
    import select

    fds = [os.open(p, os.O_RDONLY) for p in args.files]
    watch = []
    for ns in args.watch or []:
        try:
            watch += [(ns, kind, s) for kind, s in netlink_sockets(ns)]
        except OSError as exc:
            print(f"cannot watch {ns}: {exc}", file=sys.stderr)
    by_fd = {s.fileno(): (ns, kind, s) for ns, kind, s in watch}
    stop = []

    def _stop(*_):
        stop.append(1)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        os.nice(-5)  # best effort: samples on time matter more than the workers' last percent
    except OSError:
        pass
    lines: List[str] = []
    nl_lines: List[str] = []
    last_carrier = {}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    with open(args.out, "w") as out, open(args.out + ".nl", "w") as nl_out:
        print("ready", flush=True)  # the controller waits for this before the first fault
        nxt = flushed = time.monotonic()
        while not stop:
            delay = nxt - time.monotonic()
            try:
                ready = poller.poll(max(0.0, delay) * 1000.0) if by_fd else []
            except InterruptedError:
                ready = []
            if not by_fd and delay > 0:
                time.sleep(delay)
            if ready:
                nl_lines += _kernel_events([by_fd[fd] for fd, _ in ready], last_carrier)
                if time.monotonic() < nxt:
                    continue
            vals = []
            for fd in fds:
                try:
                    vals.append(os.pread(fd, 32, 0).strip().decode() or "0")
                except OSError:
                    vals.append("-1")  # the device went away (testbed torn down)
            lines.append(f"{time.time():.6f} " + " ".join(vals))
            if len(lines) >= 200 or (args.flush is not None and time.monotonic() >= flushed + args.flush):
                out.write("\n".join(lines) + "\n")
                out.flush()
                lines.clear()
                flushed = time.monotonic()
            if nl_lines:
                nl_out.write("\n".join(nl_lines) + "\n")
                nl_out.flush()
                nl_lines.clear()
            nxt += args.interval
            if nxt < time.monotonic():
                nxt = time.monotonic()
        if lines:
            out.write("\n".join(lines) + "\n")
        if nl_lines:
            nl_out.write("\n".join(nl_lines) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--flush", type=float, default=None, help="write the samples out at least every this many seconds")
    p.add_argument("--watch", action="append", default=[],
                   help="also time-stamp link carrier and nftables changes inside this network namespace")
    p.add_argument("files", nargs="+")
    return run_sampler(p.parse_args(argv))


__all__ = ["parse_netlink", "netlink_sockets", "run_sampler"]

if __name__ == "__main__":
    sys.exit(main())
