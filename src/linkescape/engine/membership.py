"""Shrinking the group: the survivors go on over the links they have.

``Communicator.shrink(exclude)`` (and torch's ``dist.shrink_group``) call
``shrink_locked`` on every survivor, under the engine's lock. No handshake and
no store exchange: each survivor ends what is in flight, leaves the excluded
ranks out, and starts a new *epoch* of message numbers, so that nothing of the
old group is ever taken for the new one's:

- every operation in flight fails with ``GroupShrunk`` (``abort``), or the
  shrink is refused while one is (``abort=False``);
- each excluded rank's links are closed after a ``BYE`` (a rank still
  connected learns at once that it is out: ``PeerLost`` from its calls); its
  re-dials and its dials are refused from then on (``peer.lost``, see
  ``Engine.adopt``), it is never a relay (``RelayRouter._can_relay``), and
  what the store or other ranks say of it, or by it, changes nothing here;
- a collective of an older epoch still on its way (a frame sent before the
  sender's shrink) is read, acknowledged and dropped by the receiver; one of a
  newer epoch (its sender shrank first) waits until this rank shrank too
  (``Matcher``, ``Receiver._match``).

Cost on each survivor: O(E) for E excluded ranks, plus the operations and
the hot peers in flight and the peers holding unexpected messages (bounded by
the work outstanding, not by N), plus one
list of the N - E survivors for the probe budget.
"""

from __future__ import annotations

import logging
from typing import Iterable

from ..common.errors import GroupShrunk, PeerLost, RankExcluded, UsageError
from ..protocol.frames import BYE
from .probes import ProbeBudget

log = logging.getLogger("linkescape.engine")


def shrink_locked(engine, excluded: Iterable[int], epoch: int, abort: bool = True) -> int:
    """(lock held) Leave ``excluded`` out and start message epoch ``epoch``; returns the
    number of operations ended."""
    gone = sorted(set(excluded))
    ops = engine.ops
    if ops and not abort:
        raise UsageError(f"{len(ops)} operation(s) in flight: wait for them, or shrink with abort")
    ended = len(ops)
    ops.fail_all(GroupShrunk(f"the group was shrunk (ranks {gone} left out) while the operation was in flight",
                             excluded=gone))
    for rank in gone:
        _exclude(engine, rank)
    engine.excluded.update(gone)
    for rank in gone:
        engine.expired.pop(rank, None)
    fatal = engine.fatal
    # a failure that named a rank now left out is over; one that names a survivor is not
    if fatal is None or (isinstance(fatal, PeerLost) and fatal.peer in engine.excluded) or \
            isinstance(fatal, GroupShrunk):
        engine.fatal = None
    engine.matcher.new_epoch(epoch)
    engine.matcher.any_recvs.clear()
    # the old group's unexpected messages go, of quiet peers too (only those holding some)
    for receiver in list(engine.matcher.holding):
        receiver.drop_stale(epoch)
    for peer in list(engine.hot):
        if peer.lost is None:
            peer.receiver.drop_stale(epoch)
            engine._apply(peer, peer.posted())  # frames parked for want of the new epoch may go on
    engine.probes = ProbeBudget([p for p in range(engine.world_size) if p != engine.rank and p not in engine.excluded],
                                engine.nrails, engine.config.probe_rate)
    engine._probed = None
    if engine.relays.blocked:
        engine._resume_unblocked()  # sources whose window to an excluded rank was full
    return ended


def _exclude(engine, rank: int) -> None:
    peer = engine.peers.find(rank)
    if peer is None:
        return
    if not isinstance(peer.lost, RankExcluded):
        peer.lost = RankExcluded(f"rank {rank} was left out of the group by a shrink", peer=rank)
    for link in list(peer.links):
        if link is not None:
            try:
                if link.open:
                    link.queue_control(BYE, peer.inbound.cumulative_ack, arg=peer.outbound.last_seq,
                                       rails=engine.rail_word.word)
                    link.flush()  # one non-blocking try: a rank cut off never reads it anyway
            except OSError:
                pass
            # what stays queued is never written: frames we relay to it free the relay's room
            # (RelayRouter.held) for their sources
            link.discard_queue()
            peer.close_link(link)
    for rail in range(engine.nrails):
        engine.down.discard((rank, rail))
    engine.relays.blocked.discard(rank)  # never read on as a relay's source (sources it blocked: resumed)
    # pairs we routed through it lose that path now (they look for a survivor to relay)
    for dst in engine.relays.relayed_through(rank):
        d = engine.peers[dst]
        engine._apply(d, d.relay_lost(rank, "via_lost"))
    if peer.relay is not None:
        engine._apply(peer, peer.relay_lost(peer.relay.via, "via_lost"))
    engine.hot.discard(peer)
    engine.degraded_watch.discard(peer)
    engine._relay_search.pop(peer, None)
    engine._probe_wanted.discard(rank)
    engine.liveness.forget(rank)


__all__ = ["shrink_locked"]
