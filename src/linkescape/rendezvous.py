"""Rendezvous: rails, the store exchange, and opening every link at start-up.

Each rank listens once per rail and publishes ``ip:port`` per rail in the
store. The higher rank of every pair connects to the lower one on every rail
(rail i to rail i) and speaks first; both sides check the handshake (magic,
version, job, ranks, rail, epoch). A connection that fails the handshake is
closed and logged, and never disturbs the job.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .config import Config
from .errors import ConfigError, HandshakeError, RendezvousError
from .protocol.frames import Hello
from .transport import tcp

log = logging.getLogger("linkescape.rendezvous")

KEY_JOB = "linkescape/job"
KEY_ADDR = "linkescape/addr/{rank}"


# ------------------------------------------------------------------ rails
def _is_ip(text: str) -> bool:
    try:
        socket.inet_aton(text)
        return text.count(".") == 3
    except OSError:
        return False


def resolve_rails(rails: Optional[Sequence[str]], store=None) -> Tuple[List[str], List[Optional[str]]]:
    """Rails as (local IPv4 addresses, interface names or None)."""
    from .health.carrier import address_for_ifname, ifname_for_address

    if not rails:
        host = _store_host(store)
        addr = tcp.route_source(host) if host else "127.0.0.1"
        return [addr], [ifname_for_address(addr)]
    addrs, names = [], []
    for rail in rails:
        if _is_ip(rail):
            addrs.append(rail)
            names.append(ifname_for_address(rail))
        else:
            addr = address_for_ifname(rail)
            if addr is None:
                raise ConfigError(f"rail {rail!r}: no such interface with an IPv4 address")
            addrs.append(addr)
            names.append(rail)
    if len(set(addrs)) != len(addrs):
        raise ConfigError(f"rails {list(rails)} resolve to repeated addresses {addrs}")
    return addrs, names


def _store_host(store) -> Optional[str]:
    seen = 0
    while store is not None and seen < 8:
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return os.environ.get("MASTER_ADDR") or None


# ------------------------------------------------------------------ store
def _store_get(store, key: str, deadline: float, waiting_for: int):
    """Get with a deadline, for torch stores (check) and plain get/set objects."""
    check = getattr(store, "check", None)
    if check is not None:
        while True:
            try:
                if check([key]):
                    return store.get(key)
            except Exception as exc:  # noqa: BLE001 - a store that cannot check
                log.debug("store.check failed (%s); falling back to get", exc)
                break
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank {waiting_for} never published {key}", missing=[waiting_for])
            time.sleep(0.005)
    return store.get(key)


def _decode(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def exchange(store, rank: int, world_size: int, my_addrs: List[Tuple[str, int]],
             deadline: float) -> Tuple[bytes, Dict[int, List[Tuple[str, int]]]]:
    if rank == 0:
        store.set(KEY_JOB, secrets.token_hex(16))
    job = _decode(_store_get(store, KEY_JOB, deadline, 0)).encode()
    store.set(KEY_ADDR.format(rank=rank), json.dumps([f"{a}:{p}" for a, p in my_addrs]))
    peers: Dict[int, List[Tuple[str, int]]] = {}
    missing = []
    for p in range(world_size):
        if p == rank:
            continue
        try:
            raw = json.loads(_decode(_store_get(store, KEY_ADDR.format(rank=p), deadline, p)))
        except RendezvousError:
            missing.append(p)
            continue
        peers[p] = [(s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])) for s in raw]
    if missing:
        raise RendezvousError(f"ranks {missing} never arrived at the store", missing=missing)
    return job, peers


# ------------------------------------------------------------------ links
class LinkSetup:
    """Opens every link of one rank at start-up (blocking, with a deadline)."""

    def __init__(self, rank: int, world_size: int, rail_addrs: List[str], config: Config) -> None:
        self.rank = rank
        self.world_size = world_size
        self.rail_addrs = rail_addrs
        self.config = config
        self.listeners = [tcp.listen(a) for a in rail_addrs]
        self.job = b""
        self.accepted: Dict[Tuple[int, int], socket.socket] = {}
        self.rejected = 0
        self._cv = threading.Condition()

    @property
    def addresses(self) -> List[Tuple[str, int]]:
        return [l.getsockname() for l in self.listeners]

    def _accept_loop(self, expected: int, deadline: float, stop: threading.Event) -> None:
        import select

        while not stop.is_set() and time.monotonic() < deadline:
            with self._cv:
                if len(self.accepted) >= expected:
                    return
            ready, _, _ = select.select(self.listeners, [], [], 0.05)
            for lsock in ready:
                try:
                    conn, addr = lsock.accept()
                except BlockingIOError:
                    continue
                self._handshake_incoming(conn, addr, min(deadline, time.monotonic() + 5.0))

    def _handshake_incoming(self, conn: socket.socket, addr, deadline: float) -> None:
        try:
            conn.setblocking(True)
            hello = tcp.read_hello(conn, deadline)
            hello.check(job=self.job, dst=self.rank, world_size=self.world_size, rails=len(self.rail_addrs))
            if hello.src <= self.rank:
                raise HandshakeError(f"rank {hello.src} must not connect to lower rank {self.rank}")
            tcp.tune(conn, self.config)
            conn.sendall(Hello(self.rank, hello.src, hello.rail, hello.epoch, 1, self.job).pack())
            conn.setblocking(False)
            with self._cv:
                old = self.accepted.pop((hello.src, hello.rail), None)
                if old is not None:
                    old.close()
                self.accepted[(hello.src, hello.rail)] = conn
                self._cv.notify_all()
        except (HandshakeError, OSError) as exc:
            self.rejected += 1
            log.warning("rank %d: rejected a connection from %s: %s", self.rank, addr, exc)
            conn.close()

    def connect_all(self, job: bytes, peers: Dict[int, List[Tuple[str, int]]], deadline: float
                    ) -> Dict[Tuple[int, int], socket.socket]:
        """Returns {(peer, rail): socket} for every pair and rail."""
        self.job = job
        nr = len(self.rail_addrs)
        for p, addrs in peers.items():
            if len(addrs) != nr:
                raise RendezvousError(f"rank {p} has {len(addrs)} rails, rank {self.rank} has {nr}",
                                      missing=[p])
        expected_in = (self.world_size - 1 - self.rank) * nr
        stop = threading.Event()
        acceptor = threading.Thread(target=self._accept_loop, args=(expected_in, deadline, stop), daemon=True)
        acceptor.start()
        out: Dict[Tuple[int, int], socket.socket] = {}
        try:
            for p in range(self.rank):
                for rail in range(nr):
                    out[(p, rail)] = self._connect(p, rail, peers[p][rail], deadline)
            acceptor.join(max(0.0, deadline - time.monotonic()))
        finally:
            stop.set()
            acceptor.join()
        with self._cv:
            missing = sorted({p for p in range(self.rank + 1, self.world_size) for r in range(nr)
                              if (p, r) not in self.accepted})
            if missing:
                for sock in out.values():
                    sock.close()
                raise RendezvousError(f"rank {self.rank}: ranks {missing} never connected", missing=missing)
            out.update(self.accepted)
        return out

    def _connect(self, peer: int, rail: int, addr: Tuple[str, int], deadline: float) -> socket.socket:
        delay = 0.01
        while True:
            try:
                hello = Hello(self.rank, peer, rail, 1, 1, self.job)
                sock, reply = tcp.connect(self.rail_addrs[rail], addr, hello, self.config,
                                          min(deadline, time.monotonic() + 10.0))
                if reply.src != peer or reply.rail != rail or reply.job != self.job.rstrip(b"\0")[:32]:
                    sock.close()
                    raise HandshakeError(f"rank {peer} rail {rail} answered with a bad handshake")
                return sock
            except (OSError, HandshakeError) as exc:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(f"rank {self.rank} could not reach rank {peer} on rail {rail} "
                                          f"at {addr[0]}:{addr[1]}: {exc}", missing=[peer]) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def close(self) -> None:
        for l in self.listeners:
            l.close()
