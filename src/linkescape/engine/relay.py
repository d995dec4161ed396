"""Relay: two ranks that share no healthy rail go on through a third.

When a peer B has no rail left (``NoPath``) and some other rank C has a live
link to us, our frames for B go to C inside RELAY frames, and C passes each
one on to B on its own link (``Forward``); B hands it to its channel of us
(``Relayed``). Sequence numbers and cumulative acks are those of the pair
A-B, untouched by C, so replay and exactly-once hold across any change of
path: after one, everything unacknowledged is sent again on the new path,
and B drops what it has.

Choosing C (``RelayRouter.choose``): among the peers with a live link to us
that did not refuse B lately, the one with the fewest relayed pairs (what it
advertises in its heartbeats, but never fewer than the pairs whose frames we
saw it pass on to us lately: a rank that advertises zero does not attract
relays past what we measured, issue 48; plus the pairs we route through it), ties
broken by a hash of the pair, so several broken pairs spread over several
ranks and the two ends of a pair tend to pick the same one.

What C holds (``RelayRouter.admit`` / ``forward``): frame by frame, never a
whole message, at most ``window`` bytes per relayed pair, at most
``SOURCE_WINDOWS`` windows for all the pairs of one source (a rank that asks
C to relay to every other rank gets no more), and at most ``RELAY_WINDOWS``
windows in all (issue 48: bounded per relay, not per pair); a frame beyond
a bound waits in the source's socket (its link parks). A source that holds
nothing there has a frame admitted whatever its size (unless C is full), and
bytes count once a frame is queued, so each link being read may bring one
frame on top: one source costs C at most ``SOURCE_WINDOWS * window`` plus a
frame per link of it (``LINKESCAPE_MAX_FRAME_BYTES``), whatever the number
of ranks; all sources together ``RELAY_WINDOWS * window`` plus a frame per
link being read. A frame for a rank C has no
link to is dropped and the source is told (RELAY_UNREACH); a link of C's to
B that fails takes the frames it held with it, and every source relaying
to B through C is told to send again (RELAY_RESET). A link of ours to C
that fails takes our RELAY frames with it: we send again at once (the
engine's ``_link_down``). A relay lost for any reason is followed by the
next rank at once, the one that failed not asked first (``_relay_ended``).

End to end, each side of a relayed pair sends a relayed heartbeat every
heartbeat interval; a relay that carried nothing from the peer for
``RELAY_SILENT`` seconds is abandoned (another C is chosen, or the pair
waits), so a relay never hides a dead peer nor makes a live one look lost.
Those heartbeats carry the pair's cumulative ack: a source whose peer's
ack has not moved for ``RELAY_RTO`` while frames of its wait for it (and
none is left in its own sockets), and that heard from the peer meanwhile,
sends them all again, so a frame lost at C is found even when the
RELAY_RESET that should have said so was lost too. (Those timers are the
pair's escape policy: ``protocol/paths.PeerPaths.relay_tick``.)
"""

from __future__ import annotations

import zlib
from typing import Dict, List, Optional, Tuple

from ..protocol.frames import FLAG_PASSED, HEADER_SIZE, RELAY, RELAY_RESET, RELAY_TRAILER, RELAY_UNREACH, pack_header
from ..protocol.linkstate import State
from .link import Link, WireItem

#: seconds a rank that refused to relay to a peer is not asked again (one search for a relay, see
#: engine.core.RELAY_RETRY: a refusal says what the rank could reach then, and faults come and go
#: faster; with 2 s a pair that lost its path again soon after found every rank still refused)
REFUSAL_MEMORY = 0.5
#: the bytes one source may have a relay hold, for all its pairs together, in relay windows
SOURCE_WINDOWS = 2
#: the bytes a relay holds for all the pairs it relays together, in relay windows
RELAY_WINDOWS = 16


class RelayPath:
    """Our route to ``dst`` through the peer ``via``: its links carry our
    frames for ``dst`` wrapped in RELAY frames."""

    def __init__(self, via: "PeerChannel", dst: int, rail_word, window: int, pair=None) -> None:
        self.via_peer = via
        self.via = via.rank
        self.dst = dst
        #: the pair's keys (protocol/relaymac.PairKeys): every frame we pass through ``via`` carries
        #: an end-to-end MAC that ``via`` cannot make
        self.pair = pair
        self.rail_word = rail_word
        self.window = window
        #: bytes of ours passed to ``via`` for ``dst`` (frames and headers)
        self.bytes = 0
        #: a frame of ``dst``'s came back through a relay: the path works
        self.confirmed = False
        # (its timers: protocol/paths.RelayClock)

    def links(self) -> List[Link]:
        via = self.via_peer
        if via.relay is not None or via.lost is not None:
            return []  # never a relay of a relay
        links = via.links
        return [l for l in (links[r] for r in via.active) if l is not None]

    def prefix(self, payload: int) -> bytes:
        """The RELAY header of a frame with ``payload`` bytes (its trailer and header follow)."""
        self.bytes += 2 * HEADER_SIZE + RELAY_TRAILER + payload
        return pack_header(RELAY, 0, 0, arg=self.dst, length=RELAY_TRAILER + HEADER_SIZE + payload,
                           rails=self.rail_word.word)

    def seal(self, header: bytes, payload=b"") -> bytes:
        """The RELAY header and the end-to-end trailer of the pair's frame (``header``, ``payload``)."""
        return self.prefix(len(payload)) + self.pair.seal(header, payload)

    def wrap(self, header: bytes, frame) -> bytes:
        """What goes before a DATA frame's payload: RELAY header, trailer, the frame's header."""
        return self.seal(header, frame.payload) + header


class _Relayed:
    """A frame held by the relay on its way (an OutFrame look-alike for WireItem)."""

    __slots__ = ("payload",)

    def __init__(self, payload: memoryview) -> None:
        self.payload = payload

    @property
    def length(self) -> int:
        return len(self.payload)


class RelayRouter:
    """Both roles of a rank in relays: the end of a pair that chooses a relay,
    and the relay that passes other pairs' frames on."""

    def __init__(self, rank: int, peers: Dict[int, "PeerChannel"], rail_word, window: int, clock) -> None:
        self.rank = rank
        self.peers = peers
        self.rail_word = rail_word
        self.window = window
        self.clock = clock
        #: (src, dst) -> bytes held for that pair now
        self.held: Dict[Tuple[int, int], int] = {}
        #: src -> bytes held for all its pairs now, and the bytes held in all
        self.held_by_src: Dict[int, int] = {}
        self.held_total = 0
        #: (src, dst) -> bytes passed on in all (a metric)
        self.passed: Dict[Tuple[int, int], int] = {}
        #: (src, dst) -> when we last passed a frame of that pair on
        self.active: Dict[Tuple[int, int], float] = {}
        #: peers waiting for the window of a pair to open (their link is parked)
        self.blocked: set = set()
        #: dst -> via, the relays we route through now (ends of pairs)
        self.routes: Dict[int, int] = {}
        #: (dst, via) -> when via refused dst
        self.refusals: Dict[Tuple[int, int], float] = {}
        #: pairs whose relays were torn down, with the bytes they carried (for the metric)
        self.sent_total: Dict[Tuple[int, int], int] = {}
        #: via -> {src: when via last passed a frame of src on to us}: what we measured of its relaying
        self.seen: Dict[int, Dict[int, float]] = {}

    # ------------------------------------------------------------ as an end of a pair
    def choose(self, dst: int, through: Optional[int] = None) -> Optional[RelayPath]:
        """A relay for our traffic to ``dst``, or None when no rank can be one.
        ``through``: a rank that just passed a frame of ``dst``'s on to us (it
        reaches both of us now, whatever it said before): that one."""
        now = self.clock.now()
        if not self.peers[dst].pairs.can_seal():
            return None  # (no usable public key of dst: nothing we send it through a relay would be taken)
        if through is not None:
            self.refusals.pop((dst, through), None)
            peer = self.peers.get(through)
            if peer is not None and self._can_relay(peer, dst):
                self.routes[dst] = through
                return RelayPath(peer, dst, self.rail_word, self.window, self._pair(dst))
        best = None
        for rank, peer in self.peers.items():
            if not self._can_relay(peer, dst):
                continue
            if now - self.refusals.get((dst, rank), -REFUSAL_MEMORY) < REFUSAL_MEMORY:
                continue
            load = max(peer.relay_load, self.measured(rank)) + sum(1 for v in self.routes.values() if v == rank)
            key = (load, zlib.crc32(f"{min(self.rank, dst)}:{max(self.rank, dst)}:{rank}".encode()))
            if best is None or key < best[0]:
                best = (key, peer)
        if best is None:
            return None
        via = best[1]
        self.routes[dst] = via.rank
        return RelayPath(via, dst, self.rail_word, self.window, self._pair(dst))

    def _pair(self, dst: int):
        return self.peers[dst].pairs

    def saw(self, via: int, src: int) -> None:
        """``via`` passed a (verified) frame of ``src`` on to us."""
        self.seen.setdefault(via, {})[src] = self.clock.now()

    def measured(self, via: int) -> int:
        """The pairs whose frames ``via`` passed on to us in the last 10 s."""
        seen = self.seen.get(via)
        if not seen:
            return 0
        now = self.clock.now()
        for src in [s for s, t in seen.items() if now - t >= 10.0]:
            del seen[src]
        return len(seen)

    @staticmethod
    def _can_relay(peer: "PeerChannel", dst: int) -> bool:
        """A peer we reach on a live link of our own, not the destination, not relayed itself."""
        if peer.rank == dst or peer.lost is not None or peer.relay is not None or not peer.active:
            return False
        return any(l is not None and peer.status[l.rail].state is State.UP for l in peer.links)

    def refused(self, dst: int, via: int) -> None:
        self.refusals[(dst, via)] = self.clock.now()
        if self.routes.get(dst) == via:
            del self.routes[dst]

    def ended(self, dst: int, path: RelayPath) -> None:
        peer = self.peers.get(dst)
        current = peer.relay if peer is not None else None
        if self.routes.get(dst) == path.via and (current is None or current is path):
            del self.routes[dst]  # (not a new path through the same rank)
        key = (dst, path.via)
        self.sent_total[key] = self.sent_total.get(key, 0) + path.bytes

    def relayed_through(self, via: int) -> List[int]:
        """The peers we route through ``via`` now."""
        return [dst for dst, v in self.routes.items() if v == via]

    # ------------------------------------------------------------ as the relay
    def admit(self, src: int, dst: int, nbytes: int) -> bool:
        """May a frame of ``src`` for ``dst`` be read now: within the pair's
        window, the source's share (``SOURCE_WINDOWS``) and the relay's
        (``RELAY_WINDOWS``)? (The bytes count once the frame is queued: a
        frame read from each of ``src``'s links may come on top, a bounded
        excess; a source that holds nothing here is never kept waiting.)"""
        mine = self.held_by_src.get(src, 0)
        total = RELAY_WINDOWS * self.window
        if not mine:  # its first frame here, whatever its size, unless the relay is full
            if self.held_total < total:
                return True
        else:
            held = self.held.get((src, dst), 0)
            if not (held and held + nbytes > self.window) and mine + nbytes <= SOURCE_WINDOWS * self.window \
                    and self.held_total + nbytes <= total:
                return True
        self.blocked.add(src)
        return False

    def forward(self, src: int, dst: int, frame: memoryview) -> Optional[Link]:
        """Pass a frame of ``src`` on to ``dst``; the link it was queued on,
        or None (no link to ``dst``: dropped, the source must be told)."""
        key = (src, dst)
        n = len(frame)
        peer = self.peers.get(dst)
        links = [] if peer is None or peer.lost is not None else \
            [l for l in (peer.links[r] for r in peer.active) if l is not None]
        if not links:
            return None
        self.held[key] = self.held.get(key, 0) + n
        self.held_by_src[src] = self.held_by_src.get(src, 0) + n
        self.held_total += n
        link = links[0] if len(links) == 1 else min(links, key=lambda l: l.out_bytes)
        header = pack_header(RELAY, 0, 0, arg=src, length=n, flags=FLAG_PASSED, rails=self.rail_word.word)
        link.queue(WireItem(header, _Relayed(frame), on_sent=lambda: self._release(key, n)))
        self.passed[key] = self.passed.get(key, 0) + n
        self.active[key] = self.clock.now()
        return link

    def _release(self, key: Tuple[int, int], n: int) -> None:
        left = self.held.get(key, 0) - n
        if left > 0:
            self.held[key] = left
        else:
            self.held.pop(key, None)
        src = key[0]
        left = self.held_by_src.get(src, 0) - n
        if left > 0:
            self.held_by_src[src] = left
        else:
            self.held_by_src.pop(src, None)
        self.held_total = max(0, self.held_total - n)

    def sources_for(self, dst: int) -> List[int]:
        """Ranks whose frames we passed on to ``dst`` lately."""
        now = self.clock.now()
        return [s for (s, d), t in self.active.items() if d == dst and now - t < 10.0]

    def pairs(self) -> int:
        """Pairs relayed through us in the last 10 s (advertised in heartbeats)."""
        now = self.clock.now()
        for key in [k for k, t in self.active.items() if now - t >= 10.0]:
            del self.active[key]
        return len(self.active)

    def take_unblocked(self) -> List[int]:
        """Sources whose parked links may read again (some window opened)."""
        if not self.blocked:
            return []
        if self.held_total >= RELAY_WINDOWS * self.window:
            return []
        out = [s for s in self.blocked if self.held_by_src.get(s, 0) < SOURCE_WINDOWS * self.window
               and all(self.held.get((s, d), 0) < self.window for d in self._dsts(s))]
        for s in out:
            self.blocked.discard(s)
        return out

    def _dsts(self, src: int) -> List[int]:
        return [d for (s, d) in self.held if s == src]


__all__ = ["RelayPath", "RelayRouter", "FLAG_PASSED", "RELAY_UNREACH", "RELAY_RESET"]
