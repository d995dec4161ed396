"""Verdicts on a peer that has no path: wait for a rail to return (and give
up with ``LinkFailure`` after the no-path deadline), or declare it gone
(``PeerLost``). A cut-off peer must never be taken for a dead one.

Evidence that the process (or its host) is gone, and nothing else:
- every rail refuses connections: its listeners are closed, the host answers
  with RST (the dialing side learns it by re-dialing; the accepting side, after
  every link ended with FIN/RST, by probing the peer's listeners);
- its liveness record in the store stopped changing while the store answers
  us (``Beacon``): a host that is off, or a process that hangs in the kernel.
- it said so: BYE (closed), or another rank recorded it as the root cause of
  its failure (``PEER_LOST`` frames, the store's failure record).

Silence on every rail, with or without FIN/RST, is not evidence: a host whose
rails are all cut, blackholed or partitioned looks exactly like that. When
the store cannot answer either, the peer is waited for until the no-path
deadline, then ``LinkFailure``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import LinkFailure, PeerLost
from ..protocol.frames import Kind

if TYPE_CHECKING:
    from .core import Engine
    from .peer import PeerChannel


class Liveness:
    def __init__(self, host: "Engine") -> None:
        self.host = host
        #: the store's view of peers (set by Communicator; None: no store)
        self.beacon = None
        #: asks Recovery to probe a peer's listeners (every link ended with FIN/RST)
        self.on_probe = None

    def check(self, peer: "PeerChannel", now: float) -> None:
        """Called on every timer tick for a peer with no path."""
        cfg = self.host.config
        if peer.lost is not None:
            return
        beacon = self.beacon
        if beacon is not None:
            beacon.watch(peer.rank)
            alive = beacon.verdict(peer.rank, cfg.peer_lost_timeout, now)
            waited = now - peer.no_path_since
            if alive is False and waited > cfg.peer_lost_timeout:
                self.lost(peer, f"rank {peer.rank} has no path on any rail and stopped refreshing its liveness "
                                f"record in the store for {cfg.peer_lost_timeout:g}s: its process or host is gone",
                          "timeout")
                return
        if peer.eof_since is not None and self.on_probe is not None and self.host.rank < peer.rank:
            self.on_probe(peer.rank)
        if now - peer.no_path_since > cfg.no_path_timeout:
            self._no_path_expired(peer, now)

    def path_back(self, peer: "PeerChannel") -> None:
        if self.beacon is not None:
            self.beacon.unwatch(peer.rank)

    def probe_failed(self, peer: "PeerChannel", rail: int, refused: bool) -> None:
        if refused:
            peer.refused.add(rail)
        else:
            peer.refused.discard(rail)
        # Nobody listens on any rail while our NICs are fine: the process is gone.
        if (peer.no_path_since is not None and peer.lost is None
                and len(peer.refused) == self.host.nrails):
            self.lost(peer, f"rank {peer.rank} closed every link and refuses connections on every rail")

    def lost(self, peer: "PeerChannel", why: str, cause: str = "socket_error") -> None:
        """``peer`` is gone. Tell the other ranks first (over surviving links,
        and the store), then fail: they name it too, not us."""
        host = self.host
        peer.lost = PeerLost(why, peer=peer.rank)
        host.emit("peer_lost", peer.rank, -1, cause, detail=why)
        self._tell_others(peer.rank, peer.lost)
        # A collective cannot complete without one of its members: every
        # operation fails now rather than waiting for its deadline.
        host.set_fatal(peer.lost)

    def _tell_others(self, lost_rank: int, error: BaseException) -> None:
        host = self.host
        if host.fatal is not None:
            return  # we failed already: the root cause was told then
        for other in host.peers.values():
            if other.rank == lost_rank or other.lost is not None:
                continue
            for link in other.live_links():
                other.tx.control(link, Kind.PEER_LOST, arg=lost_rank)
        if self.beacon is not None:
            self.beacon.report_failure(lost_rank, error)

    def reported(self, by: int, lost_rank: int) -> None:
        """Rank ``by`` told us (a PEER_LOST frame) that ``lost_rank`` is gone."""
        self._fail_with_root_cause(lost_rank, f"rank {lost_rank} is lost (reported by rank {by})")

    def root_cause(self, record: dict) -> None:
        """The store's failure record (read by the Beacon)."""
        try:
            lost_rank = int(record["peer"])
        except (KeyError, TypeError, ValueError):
            return
        self._fail_with_root_cause(lost_rank, f"rank {lost_rank} is lost (recorded by rank {record.get('by')}: "
                                              f"{record.get('why', '')})")

    def _fail_with_root_cause(self, lost_rank: int, why: str) -> None:
        host = self.host
        if host.fatal is not None or host.closed:
            return
        err = PeerLost(why, peer=lost_rank)
        peer = host.peers.get(lost_rank)
        if peer is not None and peer.lost is None:
            peer.lost = err
            host.emit("peer_lost", lost_rank, -1, "socket_error", detail=why)
        host.set_fatal(err)

    def _no_path_expired(self, peer: "PeerChannel", now: float) -> None:
        nrails = self.host.nrails
        since = time.time() - (now - peer.no_path_since)
        err = LinkFailure(f"no path to rank {peer.rank} on any rail {list(range(nrails))} since "
                          f"{time.strftime('%H:%M:%S', time.localtime(since))}", peer=peer.rank,
                          rails=list(range(nrails)), since=since)
        peer.lost = err
        self.host.ops.fail_needing(peer, err)


__all__ = ["Liveness"]
