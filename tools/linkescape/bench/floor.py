"""``--backend floor``: what an all_reduce costs in Python on this machine at the least, to judge
linkescape (and Open MPI) by.

The same rank processes, one blocking TCP socket to every other rank on loopback (``TCP_NODELAY``),
and nothing else: no progress thread, no frame headers, no acknowledgements or retransmit store, no
backup links or heartbeats, no checks. It moves the bytes the way linkescape's all_reduce does
(recursive doubling below ``LINKESCAPE_TREE_RANKS`` ranks, the k-nomial tree of
``LINKESCAPE_TREE_RADIX`` from there, both up to ``LINKESCAPE_SMALL_BYTES``; a ring above), in as
few system calls as Python allows: a send, then a blocking receive. What linkescape spends above it
is its engine's; a time of Open MPI's below it is out of reach of any Python library here
(docs/benchmarks.md). It runs ``all_reduce`` (sum, prod, min, max), ``barrier`` and ``send_recv``.
"""

from __future__ import annotations

import select
import socket
import struct
from typing import Callable, Dict, List

import numpy as np

from .backends import Backend

_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
KEY = "linkescape-bench/floor/{rank}"


def _doubling(n: int, r: int) -> tuple:
    """(p2, extra, partners) of recursive doubling: ranks from the largest power of two fold in."""
    p2 = 1
    while p2 * 2 <= n:
        p2 *= 2
    steps = []
    if r < p2:
        if r < n - p2:
            steps.append(r + p2)
        d = 1
        while d < p2:
            steps.append(r ^ d)
            d *= 2
    return p2, n - p2, steps


def _knomial(n: int, r: int, radix: int) -> tuple:
    """(parent or None, children) of rank ``r`` in the k-nomial tree rooted at 0."""
    parent = None
    if r:
        low = 1
        while not (r // low) % radix:
            low *= radix
        parent = r - (r // low) % radix * low
    children = []
    low = 1
    while low < n and not (r // low) % radix:
        children += [r + v * low for v in range(1, radix) if r + v * low < n]
        low *= radix
    return parent, children


def _recv(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("a floor rank closed its socket")
        got += k


def _duplex(out: socket.socket, data: memoryview, inp: socket.socket, into: memoryview) -> None:
    """Send ``data`` on ``out`` while receiving ``into`` from ``inp``: neither waits for the other
    (two ranks sending big messages to each other would both block in a plain send)."""
    sent, ns, got, nr = 0, len(data), 0, len(into)
    try:
        sent = out.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        pass
    if sent == ns:
        _recv(inp, into)  # the small case: one send, one blocking receive
        return
    ofd, ifd = out.fileno(), inp.fileno()
    while sent < ns or got < nr:
        poll = select.poll()
        masks: Dict[int, int] = {}
        if sent < ns:
            masks[ofd] = select.POLLOUT
        if got < nr:
            masks[ifd] = masks.get(ifd, 0) | select.POLLIN
        for fd, mask in masks.items():
            poll.register(fd, mask)
        for fd, ev in poll.poll():
            if fd == ofd and ev & select.POLLOUT and sent < ns:
                sent += out.send(data[sent:], socket.MSG_DONTWAIT)
            if fd == ifd and ev & (select.POLLIN | select.POLLHUP | select.POLLERR) and got < nr:
                k = inp.recv_into(into[got:], nr - got, socket.MSG_DONTWAIT)
                if not k:
                    raise ConnectionError("a floor rank closed its socket")
                got += k


class FloorBackend(Backend):
    name = "floor"

    def __init__(self, store, rank: int, world_size: int, host: str, timeout: float) -> None:
        from ..common.config import Config

        config = Config.from_env()
        self.small_bytes, self.tree_ranks, self.radix = config.small_bytes, config.tree_ranks, config.tree_radix
        self.rank, self.n = rank, world_size
        self.socks: Dict[int, socket.socket] = {}
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.bind((host, 0))
        lst.listen(max(1, world_size))
        store.set(KEY.format(rank=rank), f"{host}:{lst.getsockname()[1]}".encode())
        for peer in range(rank):  # dial every lower rank, say who we are
            h, p = bytes(store.get(KEY.format(rank=peer))).decode().rsplit(":", 1)
            s = socket.create_connection((h, int(p)), timeout=timeout)
            s.sendall(struct.pack("<I", rank))
            self._keep(peer, s)
        lst.settimeout(timeout)
        for _ in range(rank + 1, world_size):  # accept every higher rank
            s, _addr = lst.accept()
            who = bytearray(4)
            s.settimeout(timeout)
            _recv(s, memoryview(who))
            self._keep(struct.unpack("<I", who)[0], s)
        lst.close()
        self.token = memoryview(bytearray(1))
        self.token_in = memoryview(bytearray(1))

    def _keep(self, peer: int, s: socket.socket) -> None:
        s.settimeout(None)  # blocking
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socks[peer] = s

    # ------------------------------------------------------------ all_reduce
    def _all_reduce(self, a, root, redop, rank) -> Callable[[], None]:
        buf = a["buf"].reshape(-1)
        raw = memoryview(buf.view(np.uint8))
        red = _UFUNC[redop]
        if self.n == 1:
            return lambda: None
        if buf.nbytes > self.small_bytes:
            return self._ring(buf, red)
        if self.n >= self.tree_ranks:
            return self._tree(buf, raw, red)
        return self._doubling(buf, raw, red)

    def _doubling(self, buf: np.ndarray, raw: memoryview, red) -> Callable[[], None]:
        n, r, socks = self.n, self.rank, self.socks
        p2, extra, steps = _doubling(n, r)
        tmp = np.empty_like(buf)
        traw = memoryview(tmp.view(np.uint8))
        if r >= p2:  # fold in, get the result back
            low = socks[r - p2]

            def folded() -> None:
                low.sendall(raw)
                _recv(low, raw)
            return folded
        folding = r < extra
        parts = [(socks[p], p < r) for p in steps]

        def doubling() -> None:
            for k, (s, lower) in enumerate(parts):
                if folding and k == 0:
                    _recv(s, traw)  # the folded rank's value
                else:
                    _duplex(s, raw, s, traw)
                if lower:  # lower rank's value OP higher rank's: the same bits on both
                    red(tmp, buf, out=buf)
                else:
                    red(buf, tmp, out=buf)
            if folding:
                parts[0][0].sendall(raw)
        return doubling

    def _tree(self, buf: np.ndarray, raw: memoryview, red) -> Callable[[], None]:
        parent, children = _knomial(self.n, self.rank, self.radix)
        up = self.socks[parent] if parent is not None else None
        down = [self.socks[c] for c in children]
        tmp = np.empty_like(buf)
        traw = memoryview(tmp.view(np.uint8))

        def tree() -> None:
            for s in down:  # reduce up the tree
                _recv(s, traw)
                red(buf, tmp, out=buf)
            if up is not None:
                up.sendall(raw)
                _recv(up, raw)  # the result, down the tree
            for s in reversed(down):
                s.sendall(raw)
        return tree

    def _ring(self, buf: np.ndarray, red) -> Callable[[], None]:
        n, r = self.n, self.rank
        right, left = self.socks[(r + 1) % n], self.socks[(r - 1) % n]
        count = buf.shape[0]
        cuts = [(i * count // n, (i + 1) * count // n) for i in range(n)]
        tmp = np.empty(max(b - a for a, b in cuts), buf.dtype)
        traw = memoryview(tmp.view(np.uint8))
        braw = memoryview(buf.view(np.uint8))
        isz = buf.dtype.itemsize
        plan: List[tuple] = []
        for step in range(n - 1):  # reduce-scatter: block (r - step) goes right, (r - step - 1) comes in
            sa, sb = cuts[(r - step) % n]
            ra, rb = cuts[(r - step - 1) % n]
            plan.append((braw[sa * isz:sb * isz], traw[:(rb - ra) * isz], buf[ra:rb], tmp[:rb - ra]))
        gather = []
        for step in range(n - 1):  # all-gather: the reduced blocks go round
            sa, sb = cuts[(r + 1 - step) % n]
            ra, rb = cuts[(r - step) % n]
            gather.append((braw[sa * isz:sb * isz], braw[ra * isz:rb * isz]))

        def ring() -> None:
            for out, into, acc, got in plan:
                _duplex(right, out, left, into)
                red(acc, got, out=acc)
            for out, into in gather:
                _duplex(right, out, left, into)
        return ring

    # ------------------------------------------------------------ barrier, send_recv
    def barrier(self) -> None:
        if self.n == 1:
            return
        parent, children = _knomial(self.n, self.rank, self.radix if self.n >= self.tree_ranks else 2)
        for c in children:
            _recv(self.socks[c], self.token_in)
        if parent is not None:
            self.socks[parent].sendall(self.token)
            _recv(self.socks[parent], self.token_in)
        for c in reversed(children):
            self.socks[c].sendall(self.token)

    def _ping(self, buf, tmp):
        s, out, into = self.socks[1], memoryview(buf.reshape(-1).view(np.uint8)), memoryview(
            tmp.reshape(-1).view(np.uint8))

        def ping() -> None:
            s.sendall(out)
            _recv(s, into)
        return ping

    def _pong(self, tmp):
        s, into = self.socks[0], memoryview(tmp.reshape(-1).view(np.uint8))

        def pong() -> None:
            _recv(s, into)
            s.sendall(into)
        return pong

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks = {}

    def abort(self) -> None:
        self.close()
