"""Verdicts on a peer that has no path: wait for a rail to return, give up
with ``LinkFailure`` after the no-path deadline, or declare it gone
(``PeerLost``) when the evidence says the process, not the network, failed.

Evidence of a dead process: every rail refuses connections (its listeners are
gone), or every link ended with FIN/RST and it did not re-dial, or every rail
went silent at once while the peer did not record in the store (the
management network) that it lost its rails.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Dict, Optional

from ..errors import LinkFailure, PeerLost
from ..protocol.linkstate import Ev, State

if TYPE_CHECKING:
    from .core import Engine
    from .peer import PeerChannel


class Liveness:
    def __init__(self, host: "Engine") -> None:
        self.host = host
        #: peer -> True (it lost every rail itself: a link failure), False
        #: (it did not: it is gone), absent (not known yet); set by Recovery
        self.isolated: Dict[int, bool] = {}
        #: asks Recovery to find out whether a silent peer is isolated
        self.on_suspect: Optional[Callable[[int], None]] = None

    def check(self, peer: "PeerChannel", now: float) -> None:
        """Called on every timer tick for a peer with no path."""
        cfg = self.host.config
        if peer.no_path_since is None or peer.lost is not None:
            return
        if peer.eof_since is not None and now - peer.eof_since > cfg.peer_lost_timeout * 0.75:
            self.lost(peer, f"rank {peer.rank} closed every link and did not come back")
        elif now - peer.no_path_since > cfg.no_path_timeout:
            self._no_path_expired(peer, now)
        elif self._silent_everywhere(peer):
            # A host that lost every rail looks the same from here as
            # one that died; the isolated rank says so through the
            # store (the management network), which settles it.
            isolated = self.isolated.get(peer.rank)
            if isolated is None and self.on_suspect is not None:
                self.on_suspect(peer.rank)
            waited = now - max(st.since for st in peer.status)
            if isolated is False or (isolated is None and waited > cfg.peer_lost_timeout * 0.75):
                self.lost(peer, f"rank {peer.rank} stopped answering on every rail at once", "timeout")

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
        peer.lost = PeerLost(why, peer=peer.rank)
        self.host.emit("peer_lost", peer.rank, -1, cause, detail=why)
        # A collective cannot complete without one of its members: every
        # operation fails now rather than waiting for its deadline.
        self.host.set_fatal(peer.lost)

    def _silent_everywhere(self, peer: "PeerChannel") -> bool:
        """Every rail went silent within a short window, with no carrier
        loss on either side: the peer (process or host), not the network."""
        sts = peer.status
        if len(sts) < 2:
            return False  # one rail: a silent peer and a dead rail look the same
        if any(st.down_cause is not Ev.TIMEOUT or st.state is State.UP for st in sts):
            return False
        if any(peer.peer_carrier_down.get(st.rail) for st in sts):
            return False
        times = [st.since for st in sts]
        return max(times) - min(times) <= self.host.config.peer_lost_timeout

    def _no_path_expired(self, peer: "PeerChannel", now: float) -> None:
        nrails = self.host.nrails
        since = time.time() - (now - peer.no_path_since)
        err = LinkFailure(f"no path to rank {peer.rank} on any rail {list(range(nrails))} since "
                          f"{time.strftime('%H:%M:%S', time.localtime(since))}", peer=peer.rank,
                          rails=list(range(nrails)), since=since)
        peer.lost = err
        self.host.ops.fail_needing(peer, err)
