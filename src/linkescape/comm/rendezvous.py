"""Rendezvous: rails, the store exchange, and opening every link at start-up.

Each rank listens once per rail and publishes ``ip:port`` per rail in the
store. Rank 0 creates the job token (``linkescape/job``) and a per-job secret.
The higher rank of every pair dials the lower one on every rail (rail i to
rail i) and both prove the job's key in the handshake (protocol/handshake.py):
the configured LINKESCAPE_AUTH_KEY, else the per-job secret. A connection that
fails the handshake is closed, counted and never disturbs the job.

A key mismatch fails start-up at once with ``AuthError`` naming the rank: the
dialer learns it from the acceptor's REJECT, and records it in the store
(``linkescape/auth_failed/<job>``) so that the ranks waiting for it stop too.
A REJECT that does not verify with the dialer's key is a forged REJECT or an
acceptor with another key, and the dialer cannot tell which: it says so
(``UnverifiedReject``, an ``AuthError``: "rejected (unverified)").

The acceptor knows every peer's rail addresses from the store exchange: a
dial for (rank, rail) must arrive on this rank's listener of that rail, from
that rank's address on that rail (``RailMismatch`` otherwise).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import select
import socket
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..common import auth
from ..protocol import x25519
from ..common.config import NEIGHBOURS_FROM, Config
from ..common.errors import AuthError, ConfigError, HandshakeError, NotYet, RailMismatch, RendezvousError
from ..health.carrier import address_for_ifname, ifname_for_address
from ..protocol.handshake import LinkAuth
from ..transport import tcp
from ..transport.acceptor import Acceptor

log = logging.getLogger("linkescape.rendezvous")

KEY_JOB = "linkescape/job"
KEY_ADDR = "linkescape/addr/{rank}"
#: the per-job secret, under the job's token so that a reader always gets the pair
KEY_SECRET = auth.KEY_SECRET + "/{job}"
KEY_AUTH_FAILED = "linkescape/auth_failed/{job}"
#: the start-up barrier of ``connect_at_start=neighbours``: a count, and a key the last rank sets
KEY_STARTED = "linkescape/started/{job}"
KEY_ALL_STARTED = "linkescape/all_started/{job}"
KEY_START_FAILED = "linkescape/start_failed/{job}"
#: start-up dials in flight at once
DIAL_PARALLEL = 64


# ------------------------------------------------------------------ rails
def _is_ip(text: str) -> bool:
    try:
        socket.inet_aton(text)
        return text.count(".") == 3
    except OSError:
        return False


def resolve_rails(rails: Optional[Sequence[str]], store=None) -> Tuple[List[str], List[Optional[str]]]:
    """Rails as (local IPv4 addresses, interface names or None)."""
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
    """Get with a deadline, for torch stores (wait, else check) and plain get/set objects."""
    wait = getattr(store, "wait", None)
    if wait is not None:  # woken when the key is set (a poll's sleep would add up to 5 ms a rank)
        try:
            wait([key], datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
            return store.get(key)
        except Exception as exc:  # noqa: BLE001 - a timeout, or a store that cannot wait
            log.debug("store.wait for %s failed (%s); checking instead", key, exc)
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


def _get_all(store, keys: List[str], deadline: float) -> Optional[list]:
    """Every key's value in two store calls (wait for all, then multi_get)
    where the store has both (torch's stores); None where it has not, or
    when some key is still missing at the deadline (the caller then finds
    which, key by key)."""
    wait, multi_get = getattr(store, "wait", None), getattr(store, "multi_get", None)
    if not keys or wait is None or multi_get is None:
        return None
    try:
        wait(keys, datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
    except Exception as exc:  # noqa: BLE001 - a timeout, or a store that cannot wait
        log.debug("store.wait for %d keys failed (%s); asking key by key", len(keys), exc)
        return None
    try:
        return list(multi_get(keys))
    except Exception as exc:  # noqa: BLE001 - a store without a working multi_get
        log.debug("store.multi_get failed (%s); asking key by key", exc)
        return [store.get(k) for k in keys]


def _decode(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _decode_all(values) -> Optional[list]:
    """Every peer's address record in one JSON parse (one per record is what
    start-up spent most of its exchange on); None when one of them is not
    bytes or not JSON: then each is decoded alone."""
    if not all(isinstance(v, (bytes, bytearray)) for v in values):
        return None
    try:
        out = json.loads(b"[" + b",".join(values) + b"]")
    except ValueError:
        return None
    return out if len(out) == len(values) else None


def exchange(store, rank: int, world_size: int, my_addrs: List[Tuple[str, int]], deadline: float,
             with_secret: bool = False, public: bytes = b"",
             publics: Optional[Dict[int, bytes]] = None) -> Tuple[bytes, Dict[int, List[Tuple[str, int]]], Optional[bytes]]:
    """(job token, {peer: its rail addresses}, the per-job secret or None).
    ``with_secret``: read the per-job secret (rank 0 wrote it before the
    token) with the addresses, in the same two store calls, where the store
    can (wait and multi_get); else it is None and ``job_secret`` reads it.
    ``public``: our X25519 public key, published with our addresses
    (``{"rails": [...], "x25519": hex}``); the peers' go into ``publics``
    (a record without one, the older list of addresses, gives none)."""
    if rank == 0:
        token = secrets.token_hex(16)
        store.set(KEY_SECRET.format(job=token), auth.new_job_secret())  # before the job: readers find both
        store.set(KEY_JOB, token)
    job = _decode(_store_get(store, KEY_JOB, deadline, 0)).encode()
    rails = [f"{a}:{p}" for a, p in my_addrs]
    store.set(KEY_ADDR.format(rank=rank), json.dumps({"rails": rails, "x25519": public.hex()} if public else rails))
    peers: Dict[int, List[Tuple[str, int]]] = {}
    missing = []
    others = [p for p in range(world_size) if p != rank]
    keys = [KEY_ADDR.format(rank=p) for p in others]
    values = _get_all(store, keys + [KEY_SECRET.format(job=job.decode())] if with_secret else keys, deadline)
    secret = _decode(values.pop()).encode() if with_secret and values is not None else None
    decoded = _decode_all(values) if values is not None else None
    for i, p in enumerate(others):
        try:
            raw = decoded[i] if decoded is not None else json.loads(_decode(
                values[i] if values is not None else _store_get(store, KEY_ADDR.format(rank=p), deadline, p)))
            if isinstance(raw, dict):
                key = raw.get("x25519")
                if publics is not None and key:
                    publics[p] = bytes.fromhex(key)
                    if len(publics[p]) != x25519.KEY_SIZE:
                        raise ValueError(f"an X25519 public key of {len(publics[p])} bytes")
                raw = raw["rails"]
            peers[p] = [(host, int(port)) for host, _, port in (s.rpartition(":") for s in raw)]
        except RendezvousError:
            missing.append(p)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise RendezvousError(f"rank {p}'s addresses in the store are not a list of host:port ({exc})",
                                  missing=[p]) from None
    if missing:
        raise RendezvousError(f"ranks {missing} never arrived at the store", missing=missing)
    return job, peers, secret


def job_secret(store, job: bytes, deadline: float) -> bytes:
    """The per-job secret rank 0 published with ``job``."""
    return _decode(_store_get(store, KEY_SECRET.format(job=job.decode()), deadline, 0)).encode()


def start_up_peers(rank: int, world_size: int, config: Config, store) -> Optional[set]:
    """The peers whose links start-up opens before it returns (None: all of them).

    ``neighbours``: the two ring neighbours only. A rank's start-up then costs
    O(1) handshakes instead of O(N) (Python handshakes of every rank on a
    shared host were what made init slower than Gloo's from 16 ranks on); the
    other links are opened right after, off the caller's path, as the backups
    are. Every set of ranks configured with one key has a ring edge to a rank
    with another key, so a key mismatch still stops start-up (see
    ``LinkSetup.barrier``). It needs a store that counts (``add``)."""
    mode = config.connect_at_start
    can_count = getattr(store, "add", None) is not None
    if mode == "all" or not can_count or (mode == "auto" and world_size < NEIGHBOURS_FROM):
        return None
    return {(rank - 1) % world_size, (rank + 1) % world_size} - {rank}


# ------------------------------------------------------------------ links
class LinkSetup:
    """Opens every link of one rank at start-up (blocking, with a deadline).

    The listeners exist from the start (their addresses go to the store); the
    ``acceptor`` that authenticates what connects to them is made once the job
    is known and is handed on to recovery afterwards."""

    #: how often a rank waiting for others looks for a peer's key mismatch
    FLAG_INTERVAL = 0.5

    def __init__(self, rank: int, world_size: int, rail_addrs: List[str], config: Config) -> None:
        self.rank = rank
        self.world_size = world_size
        self.rail_addrs = rail_addrs
        self.config = config
        self.listeners = [tcp.listen(a) for a in rail_addrs]
        self.job = b""
        self.auth: Optional[LinkAuth] = None
        self.acceptor: Optional[Acceptor] = None
        self.accepted: Dict[Tuple[int, int], socket.socket] = {}
        self._store = None
        self._abort: Optional[BaseException] = None
        self._flag_at = 0.0
        self._auth_seen = 0
        self._rails: set = set(range(len(rail_addrs)))
        #: the peers whose links start-up opens (None: all)
        self._peers_now: Optional[set] = None
        #: (peer, rail) -> the key of that link alone (frame MACs)
        self.link_keys: Dict[Tuple[int, int], bytes] = {}

    @property
    def addresses(self) -> List[Tuple[str, int]]:
        return [l.getsockname() for l in self.listeners]

    @property
    def rejected(self) -> int:
        """Connections closed for failing the handshake or the key proof."""
        return self.acceptor.rejected if self.acceptor is not None else 0

    # ------------------------------------------------------------ key mismatch
    def _flag_key(self) -> str:
        return KEY_AUTH_FAILED.format(job=self.job.decode())

    def _report_auth_failure(self, exc: AuthError) -> None:
        if self._store is None:
            return
        try:
            self._store.set(self._flag_key(), json.dumps({"rank": self.rank, "peer": exc.peer}))
        except Exception as exc2:  # noqa: BLE001 - best effort: our own error is raised anyway
            log.debug("rank %d: cannot record the auth failure in the store: %s", self.rank, exc2)

    def _check_flag(self, force: bool = False) -> None:
        """Raise AuthError if another rank stopped on a key mismatch (it will
        never connect or accept: waiting for it would last the whole deadline)."""
        if self._abort is not None:
            raise self._abort
        store = self._store
        now = time.monotonic()
        if store is None or getattr(store, "check", None) is None or (
                not force and now - self._flag_at < self.FLAG_INTERVAL):
            return
        self._flag_at = now
        info = self._record(store, self._flag_key(), "key mismatches")
        if info is None:
            return
        who, peer = info["rank"], info.get("peer")
        if who == self.rank:
            return
        self._abort = AuthError(f"rank {who} reports through the store that it could not authenticate its link to "
                                f"rank {peer}: different keys (LINKESCAPE_AUTH_KEY / LINKESCAPE_AUTH_KEY_FILE), "
                                f"or a forged REJECT", peer=who)
        raise self._abort

    # ------------------------------------------------------------ accepting
    def _admit(self, peer: int, rail: int, epoch: int) -> int:
        if rail not in self._rails or (self._peers_now is not None and peer not in self._peers_now):
            # a link dialed early by a peer whose start-up is done: it comes back once recovery accepts
            raise NotYet(f"rail {rail} to rank {peer} is opened after start-up")
        return 1  # nothing received yet: replay would start at seq 1

    def _accept_some(self) -> None:
        """Advance the incoming handshakes (never blocks) and keep the links
        whose dialer proved the key."""
        acc = self.acceptor
        for link in acc.poll(self._admit):
            old = self.accepted.pop((link.peer, link.rail), None)
            if old is not None:  # the dialer gave up on it and dialed again
                old.close()
            self.accepted[(link.peer, link.rail)] = link.sock
            self.link_keys[(link.peer, link.rail)] = link.link_key
        seen = sum(acc.auth_failures.values())
        self._check_flag(force=seen != self._auth_seen)
        self._auth_seen = seen

    # ------------------------------------------------------------ all links
    def connect_all(self, job: bytes, peers: Dict[int, List[Tuple[str, int]]], deadline: float,
                    store=None, rails: Optional[Sequence[int]] = None,
                    peers_now: Optional[set] = None, secret: Optional[bytes] = None) -> Dict[Tuple[int, int], socket.socket]:
        """Returns {(peer, rail): socket} for every pair and rail. ``store``:
        where the per-job secret is (when no key is configured) and where key
        mismatches are reported. ``rails``: the rails opened now (default: all
        of them); ``peers_now``: the peers (default: all of them, see
        ``start_up_peers``); the other links are opened by recovery once the
        job runs. ``secret``: the per-job secret if ``exchange`` read it
        (else it is read from the store when no key is configured)."""
        self.job = job
        self._store = store
        # the first look for a peer's key mismatch comes after FLAG_INTERVAL (or at once when a
        # handshake failed here): a start-up that goes well asks the store nothing more
        self._flag_at = time.monotonic()
        nr = len(self.rail_addrs)
        for p, addrs in peers.items():
            if len(addrs) != nr:
                raise RendezvousError(f"rank {p} has {len(addrs)} rails, rank {self.rank} has {nr}",
                                      missing=[p])
        if auth.load_key(self.config) is not None:
            secret = None
        elif secret is None:
            if store is None:
                raise ConfigError("no LINKESCAPE_AUTH_KEY and no store to hold a per-job secret")
            secret = job_secret(store, job, deadline)
        key, _source = auth.link_key(self.config, secret, self.rank)
        self.auth = LinkAuth(key, job, self.rank, self.world_size, nr)
        self.acceptor = Acceptor(self.listeners, self.auth, self.config, peer_addrs=peers)
        self._rails = set(range(nr)) if rails is None else set(rails)
        self._peers_now = peers_now
        higher = [p for p in range(self.rank + 1, self.world_size) if peers_now is None or p in peers_now]
        expected_in = len(higher) * len(self._rails)
        out: Dict[Tuple[int, int], socket.socket] = {}
        try:
            # dials and accepts from this one thread and one poll (a thread of
            # its own would first have to be scheduled: on a loaded host, the
            # time every dialer of this rank waits)
            self._dial_all(peers, sorted(self._rails), deadline, out, expected_in)
            if self._abort is not None:
                raise self._abort
        except BaseException:
            for sock in out.values():
                sock.close()
            raise
        missing = sorted({p for p in higher for r in self._rails if (p, r) not in self.accepted})
        if missing:
            for sock in out.values():
                sock.close()
            raise RendezvousError(f"rank {self.rank}: ranks {missing} never connected", missing=missing)
        out.update(self.accepted)
        return out

    def _dial_all(self, peers: Dict[int, List[Tuple[str, int]]], rails: List[int], deadline: float,
                  out: Dict[Tuple[int, int], socket.socket], expected_in: int = 0) -> None:
        """Dial every lower rank on every rail, ``DIAL_PARALLEL`` at a time,
        all from this thread: each dial is a non-blocking socket and its
        handshake, advanced when ``poll`` finds it ready (a dial mostly
        waits for the peer, so one at a time made start-up grow with N x the
        round trip, and a thread per dial cost more than the dial). A dial
        that fails (refused, reset, no answer in 10 s) is retried with
        backoff until ``deadline``; a key mismatch stops them all. The same
        loop accepts the ``expected_in`` links of the higher ranks."""
        todo = [(p, rail) for p in range(self.rank) for rail in rails
                if self._peers_now is None or p in self._peers_now]
        todo.reverse()  # popped from the end: lowest rank first
        retry_at: Dict[Tuple[int, int], float] = {}
        delays: Dict[Tuple[int, int], float] = {}
        live: Dict[int, Tuple[Tuple[int, int], tcp.Dial]] = {}
        waiting: List[Tuple[int, int]] = []
        acc = self.acceptor
        try:
            while todo or live or waiting or (acc is not None and len(self.accepted) < expected_in):
                now = time.monotonic()
                if now > deadline and not (todo or live or waiting):
                    return  # only accepts were left: the caller names the ranks that never connected
                # (a dial past the deadline fails below and _dial_failed raises, naming its peer)
                for key in [k for k in waiting if retry_at[k] <= now]:
                    waiting.remove(key)
                    todo.append(key)
                while todo and len(live) < DIAL_PARALLEL:
                    key = todo.pop()
                    try:
                        dial = self._start_dial(key, peers, deadline)
                    except AuthError as exc:  # a near acceptor answered in the first step
                        self._auth_failed(exc)
                        raise
                    except (OSError, HandshakeError) as exc:
                        self._dial_failed(key, exc, peers, deadline, retry_at, delays, waiting)
                        continue
                    if dial.done:  # a near peer: established in the first step
                        out[key] = dial.sock
                        self.link_keys[key] = dial.established.link_key
                        continue
                    live[dial.fileno()] = (key, dial)
                poller = select.poll()  # not select(): descriptors past 1024 at large N
                for fd, (_k, d) in live.items():
                    poller.register(fd, select.POLLIN | (select.POLLOUT if d.wants_write else 0))
                if acc is not None:
                    poller.register(acc.fileno(), select.POLLIN)
                soonest = min((retry_at[k] for k in waiting), default=now + 0.05)
                ready = {fd for fd, _ev in poller.poll(1000 * max(0.0, min(0.05, soonest - now)))}
                if acc is not None:
                    self._accept_some()
                now = time.monotonic()
                for fd in list(live):
                    key, dial = live[fd]
                    if fd not in ready and now <= dial.deadline:
                        continue
                    try:
                        done = dial.step(now)
                    except AuthError as exc:
                        self._auth_failed(exc)
                        raise
                    except (OSError, HandshakeError) as exc:
                        del live[fd]
                        dial.close()
                        self._dial_failed(key, exc, peers, deadline, retry_at, delays, waiting)
                        continue
                    if done:
                        del live[fd]
                        out[key] = dial.sock
                        self.link_keys[key] = dial.established.link_key
                if self._abort is not None:
                    raise self._abort
        finally:
            for _key, dial in live.values():
                dial.close()

    def barrier(self, store, deadline: float, meanwhile: Optional[Callable[[], None]] = None) -> None:
        """(``connect_at_start=neighbours``) Wait until every rank opened its
        start-up links, looking for failures meanwhile: a rank with another
        key fails with its ring neighbours, who record it in the store, and
        every rank then stops here with ``AuthError``, as when all links open
        at start-up; a rank whose start-up failed otherwise (a neighbour it
        cannot reach) records that, and every rank stops with
        ``RendezvousError`` naming it. Two store calls per rank (three for
        the last to arrive), and two looks at the failure records every
        FLAG_INTERVAL while waiting. ``meanwhile`` runs once this rank has
        arrived, before it waits for the others."""
        job = self.job.decode()
        key = KEY_ALL_STARTED.format(job=job)
        if int(store.add(KEY_STARTED.format(job=job), 1)) >= self.world_size:
            store.set(key, "1")
        if meanwhile is not None:
            meanwhile()
        wait = getattr(store, "wait", None)
        looked = time.monotonic()
        while True:
            left = deadline - time.monotonic()
            try:
                if wait is not None:
                    wait([key], datetime.timedelta(seconds=max(0.001, min(self.FLAG_INTERVAL, left))))
                    return
                if store.check([key]):
                    return
                time.sleep(0.01)
            except Exception as exc:  # noqa: BLE001 - a store's wait times out with its own error type
                log.debug("rank %d: start-up barrier: %s", self.rank, exc)
            if wait is not None or time.monotonic() - looked >= self.FLAG_INTERVAL:
                looked = time.monotonic()
                self._check_flag(force=True)
                self._check_start_failed(store)
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank {self.rank}: not every rank finished start-up "
                                      f"({int(store.add(KEY_STARTED.format(job=job), 0))} of {self.world_size})")

    def report_start_failure(self, store, exc: BaseException) -> None:
        """(``connect_at_start=neighbours``) Our start-up failed: say so in the
        store, so that the ranks waiting at the barrier stop, naming us."""
        if not self.job or isinstance(exc, AuthError):
            return  # (a key mismatch has its own record)
        try:
            store.set(KEY_START_FAILED.format(job=self.job.decode()),
                      json.dumps({"rank": self.rank, "error": f"{type(exc).__name__}: {exc}"[:500]}))
        except Exception as exc2:  # noqa: BLE001 - best effort: our own error is raised anyway
            log.debug("rank %d: cannot record the start-up failure in the store: %s", self.rank, exc2)

    def _check_start_failed(self, store) -> None:
        info = self._record(store, KEY_START_FAILED.format(job=self.job.decode()), "start-up failures")
        if info is not None:
            who = info["rank"]
            raise RendezvousError(f"rank {who} could not start: {info.get('error')}", missing=[who])

    def _record(self, store, key: str, what: str) -> Optional[dict]:
        """Another rank's record under ``key`` (a JSON object naming its ``rank``),
        or None: none yet, or no answer from the store (keep waiting)."""
        try:
            if not store.check([key]):
                return None
            info = json.loads(_decode(store.get(key)))
            info["rank"] = int(info["rank"])
            return info
        except Exception as exc:  # noqa: BLE001
            log.debug("rank %d: no word on %s: %s", self.rank, what, exc)
            return None

    def _auth_failed(self, exc: AuthError) -> None:
        self._report_auth_failure(exc)
        if self._abort is None:
            self._abort = exc

    def _start_dial(self, key: Tuple[int, int], peers, deadline: float) -> "tcp.Dial":
        peer, rail = key
        attempt = min(deadline, time.monotonic() + 10.0)
        hs = self.auth.dialer(peer, rail, 1, 1, attempt)
        return tcp.Dial(self.rail_addrs[rail], peers[peer][rail], hs, self.config, attempt)

    def _dial_failed(self, key: Tuple[int, int], exc: BaseException, peers, deadline: float,
                     retry_at: Dict, delays: Dict, waiting: List) -> None:
        """Retry ``key`` after a backoff, or raise once the deadline would pass."""
        self._check_flag()
        peer, rail = key
        if isinstance(exc, RailMismatch) and key not in delays:  # said at once: retrying rarely mends a route
            log.warning("rank %d: the link to rank %d on rail %d is mis-routed (%s); retrying until the "
                        "connect deadline", self.rank, peer, rail, exc)
        delay = delays.get(key, 0.01)
        if time.monotonic() + delay > deadline:
            addr = peers[peer][rail]
            raise RendezvousError(f"rank {self.rank} could not reach rank {peer} on rail {rail} "
                                  f"at {addr[0]}:{addr[1]}: {exc}", missing=[peer]) from exc
        delays[key] = min(delay * 2, 0.5)
        retry_at[key] = time.monotonic() + delay
        waiting.append(key)

    def close(self) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
        for l in self.listeners:
            l.close()
