"""Processes of the failover benchmark: one rank of a saturating all_reduce, and a NIC-counter sampler.

``python -m linkescape.bench.failover_worker rank --rank R --world N --store DIR ...``
keeps ``--depth`` asynchronous all_reduces in flight until the ranks agree to
stop (the stop file appears or ``--duration`` passes), checks every result
bit for bit against a precomputed exact reference, and prints JSON lines:
``ready``, ``done`` (per iteration: completion wall time ``t``, ``wrong``),
``exit`` (iterations, wrong elements, error, engine per-link byte counters).

The ranks stop together: every iteration carries a tiny companion
all_reduce of each rank's "want to stop" flag, so all ranks see the same sum
for the same iteration and leave the loop at the same point (a per-rank clock
would let one rank start a collective the others never join).

``python -m linkescape.bench.failover_worker sample --out FILE --interval S [--watch NETNS]... FILE...``
reads the given counter files (``/sys/class/net/DEV/statistics/*_bytes``)
every ``S`` seconds and appends ``t v1 v2 ...`` lines to ``FILE`` until it is
signalled (SIGTERM/SIGINT). Run in the root namespace it samples the
bridge-side veths, i.e. what each host's NIC really put on (or took off) the
wire after the tbf shaper. With ``--watch`` it also listens to rtnetlink link
events and nftables events inside those namespaces and writes them, time
stamped on arrival, to ``FILE.nl`` (JSON lines): the moment a cut (carrier
loss) or a blackhole (its nftables chains committed) really took effect,
which the fault command's own return time only bounds from above.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from typing import List

import numpy as np


def say(**record) -> None:
    record.setdefault("t", time.time())
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def pattern(rank: int, k: int, count: int, dtype) -> np.ndarray:
    """Small integers: every sum is exact, so results are checked bit for bit."""
    rng = np.random.default_rng([rank, k, count, 7])
    return rng.integers(-8, 9, size=count).astype(dtype)


def _link_bytes(comm) -> dict:
    out = {}
    try:
        for p, peer in comm._engine.peers.items():
            for r, link in enumerate(peer.links):
                if link is not None:
                    out[f"{p}/{r}"] = [int(link.bytes_sent), int(link.bytes_received)]
    except Exception:  # noqa: BLE001 - diagnostics only
        pass
    return out


def run_rank(args) -> int:
    import faulthandler

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the controller asks before killing a hung rank

    from linkescape import Communicator, FileStore

    dtype = np.dtype(args.dtype)
    n, count, depth = args.world, args.count, max(1, args.depth)
    npat = 4
    inputs = [pattern(args.rank, k, count, dtype) for k in range(npat)]
    refs = []
    for k in range(npat):
        acc = np.zeros(count, np.int64)
        for q in range(n):
            acc += pattern(q, k, count, np.int64)
        refs.append(acc.astype(dtype).view(np.uint8))
    bufs = [np.empty(count, dtype) for _ in range(depth)]
    flags = [np.zeros(1, np.int32) for _ in range(depth)]
    wrong = 0
    iters = 0
    error = None
    comm = None
    t_end = time.time() + args.duration
    try:
        comm = Communicator(FileStore(args.store, timeout=60), args.rank, n)
        say(event="ready", rank=args.rank, rails=comm.rails, nbytes=int(count * dtype.itemsize))
        inflight: List[tuple] = []  # (iteration, slot, work, flag work)
        posted = 0
        stop = False
        while True:
            while not stop and len(inflight) < depth:
                slot = posted % depth
                buf = bufs[slot]
                np.copyto(buf, inputs[posted % npat])
                want = time.time() >= t_end or (args.stop_file and os.path.exists(args.stop_file))
                flags[slot][0] = 1 if want else 0
                w = comm.all_reduce(buf, async_op=True)
                wf = comm.all_reduce(flags[slot], async_op=True)
                inflight.append((posted, slot, w, wf))
                posted += 1
            if not inflight:
                break
            it, slot, w, wf = inflight.pop(0)
            w.wait()
            wf.wait()
            t = time.time()
            bad = int(np.count_nonzero(bufs[slot].view(np.uint8) != refs[it % npat]))
            wrong += bad
            iters += 1
            say(event="done", iter=it, t=t, wrong=bad)
            if flags[slot][0] > 0:
                stop = True  # every rank sees the same sum here: all stop after the same iteration
        comm.barrier()
        say(event="links", links=_link_bytes(comm))
        comm.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the controller
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    say(event="exit", rank=args.rank, wrong=wrong, iters=iters, error=error,
        error_type=None if error is None else error.split(":")[0])
    sys.stdout.flush()
    os._exit(0 if error is None and wrong == 0 else 1)


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
        nxt = time.monotonic()
        while not stop:
            delay = nxt - time.monotonic()
            try:
                ready = poller.poll(max(0.0, delay) * 1000.0) if by_fd else []
            except InterruptedError:
                ready = []
            if not by_fd and delay > 0:
                time.sleep(delay)
            if ready:
                t = time.time()
                for fd, _ in ready:
                    ns, kind, sock = by_fd[fd]
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
                            nl_lines.append(json.dumps({"t": t, "netns": ns, "what": what, "name": name, "up": up}))
                if time.monotonic() < nxt:
                    continue
            vals = []
            for fd in fds:
                try:
                    vals.append(os.pread(fd, 32, 0).strip().decode() or "0")
                except OSError:
                    vals.append("-1")  # the device went away (testbed torn down)
            lines.append(f"{time.time():.6f} " + " ".join(vals))
            if len(lines) >= 200:
                out.write("\n".join(lines) + "\n")
                out.flush()
                lines.clear()
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
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rank", help="one rank of the saturating all_reduce")
    r.add_argument("--rank", type=int, required=True)
    r.add_argument("--world", type=int, required=True)
    r.add_argument("--store", required=True)
    r.add_argument("--count", type=int, default=4 << 20, help="float32 elements per all_reduce")
    r.add_argument("--dtype", default="float32")
    r.add_argument("--depth", type=int, default=2, help="all_reduces kept in flight")
    r.add_argument("--duration", type=float, default=600.0, help="stop after this many seconds at the latest")
    r.add_argument("--stop-file", default=None, help="stop (all ranks together) once this file exists")
    s = sub.add_parser("sample", help="sample counter files")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.005)
    s.add_argument("--watch", action="append", default=[],
                   help="also time-stamp link carrier and nftables changes inside this network namespace")
    s.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "rank":
        return run_rank(args)
    return run_sampler(args)


if __name__ == "__main__":
    sys.exit(main())
