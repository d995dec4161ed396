"""What every peer of one rank shares (engine/peer.py's ``PeerChannel`` is given it when
built): the configuration, clock and poll set, the path policy, the rail word and the rails'
goodput references, the matcher of receives, the relay's admission, the keys of relayed frames;
and the engine's ``Wakeup`` and a ``Scratch`` buffer. ``PeerEnv`` is read-only to the peers.

Costs: one per rank, O(1) in N (the keys hold O(N) public keys: protocol/relaymac.py)."""

from __future__ import annotations

from typing import Callable, Optional

from ..protocol.linkstate import PathPolicy
from ..protocol.relaymac import RankKeys
from ..transport.tcp import ack_silence
from .messages import EPOCH_SHIFT

INF = float("inf")


class Matcher:
    """What receives of all peers share: any-source receives not matched yet
    (by tag, in posting order), and the last collective started here.

    ``epoch``: how many shrinks made the group (``Communicator.shrink``). A
    frame of an older group's message is read and dropped (collectives below
    ``floor``; point-to-point frames carry their group's epoch in ``sig``); one
    of a newer group (its sender shrank first) waits until this rank shrank too."""

    def __init__(self) -> None:
        self.any_recvs: dict = {}
        self.coll_started = 0
        #: the collectives that failed here lately: what the others still send for them is dropped
        self.coll_failed: set = set()
        self.epoch = 0
        self.floor = 0
        #: the receivers (one per peer) holding unexpected point-to-point messages (a shrink drops the
        #: old group's there, quiet peers too, without a scan of all peers)
        self.holding: set = set()

    def failed(self, msg: int) -> None:
        failed = self.coll_failed
        failed.add(msg)
        if len(failed) > 256:  # (the oldest: their frames came long ago)
            failed.discard(min(failed))

    def new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.floor = self.coll_started = epoch << EPOCH_SHIFT
        self.coll_failed.clear()


class Wakeup:
    """The earliest a peer asked the timers for since the engine last looked (a deadline set
    outside a timer round: a silence check, an owed ack). Peers ask (``soon``); the engine takes it."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = INF

    def soon(self, when: float) -> None:
        """Run the timers no later than ``when``."""
        if when < self.at:
            self.at = when

    def take(self) -> float:
        at, self.at = self.at, INF
        return at


class Scratch:
    """A buffer for payload bytes nobody needs (duplicates, dropped messages), shared by the peers."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = memoryview(bytearray(1 << 16))

    def discard(self, n: int) -> memoryview:
        if len(self._buf) < n:
            self._buf = memoryview(bytearray(n))
        return self._buf[:n]


class PeerEnv:
    """What every peer of one rank is given when it is built. Read-only to the peers: the
    engine alone changes ``local_down``, ``relaying`` and ``fault_at`` (``update``); a peer asks for the
    timers through ``soon`` (the engine's ``Wakeup``) and for a buffer to drop bytes into through
    ``discard`` (a ``Scratch``), which are not state of this object."""

    __slots__ = ("rank", "nrails", "config", "clock", "io", "policy", "rail_word", "rail_rates", "matcher",
                 "protect", "relay_admit", "keys", "ack_silence", "watermark", "relaying", "local_down",
                 "fault_at", "wakeup", "soon", "discard", "_frozen")

    def __init__(self, rank: int, nrails: int, config, clock, io, policy: PathPolicy, rail_word, rail_rates,
                 matcher: Matcher, protect: Callable[[memoryview], None],
                 relay_admit: Callable[[int, int, int], bool], tcp_probe=ack_silence,
                 keys: Optional[RankKeys] = None) -> None:
        s = object.__setattr__
        s(self, "_frozen", False)
        self.rank = rank
        self.nrails = nrails
        self.config = config
        self.clock = clock
        self.io = io
        self.policy = policy
        self.rail_word = rail_word
        self.rail_rates = rail_rates
        self.matcher = matcher
        self.protect = protect
        self.relay_admit = relay_admit
        #: our X25519 key and the peers' public keys: the end-to-end MACs of relayed frames
        self.keys = keys if keys is not None else RankKeys(rank)
        #: the kernel's acknowledgement silence of a socket (TCP_INFO); tests give another
        self.ack_silence = tcp_probe
        #: bytes a link may have queued before the sender stops carving frames
        self.watermark = 2 * config.chunk_bytes
        #: the pairs this rank relays for others (advertised in heartbeats)
        self.relaying = 0
        #: rails this rank holds down, a bitmask: its NIC without carrier, or an
        #: emulated fault (neither dialed nor accepted on until it is back)
        self.local_down = 0
        #: when a link of this rank last went down (-inf: never): the busy pairs' backups beat every
        #: heartbeat interval for ``paths.CALM_AFTER`` seconds after it (``PeerTimers.calm``)
        self.fault_at = -INF
        self.wakeup = Wakeup()
        #: ``soon(when)``: run the timers no later than ``when``
        self.soon = self.wakeup.soon
        #: ``discard(n)``: a buffer for ``n`` payload bytes nobody needs
        self.discard = Scratch().discard
        s(self, "_frozen", True)

    def __setattr__(self, name: str, value) -> None:
        if self._frozen:
            raise AttributeError(f"PeerEnv.{name} is read-only to the peers (the engine uses update())")
        object.__setattr__(self, name, value)

    def update(self, **fields) -> None:
        """(the engine only) Change what the peers read: ``local_down``, ``relaying``, ``fault_at``."""
        for name, value in fields.items():
            if name not in ("local_down", "relaying", "fault_at"):
                raise AttributeError(f"PeerEnv.{name} does not change while the engine runs")
            object.__setattr__(self, name, value)


__all__ = ["Matcher", "Wakeup", "Scratch", "PeerEnv"]
