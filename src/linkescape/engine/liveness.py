"""Verdicts on a peer that has no path: wait for a rail to return (and give
up with ``LinkFailure`` after the no-path deadline), or declare it gone
(``PeerLost``). A cut-off peer must never be taken for a dead one.

Evidence that the process (or its host) is gone, and nothing else:
- every rail refuses connections: its listeners are closed, the host answers
  with RST (the dialing side learns it by re-dialing; the accepting side, after
  every link ended with FIN/RST, by probing the peer's listeners);
- its liveness record in the store stopped changing while the store answers
  us (``Beacon``), and a knock on its listeners (a TCP connect, closed at
  once; it starts ``KNOCK_WAIT`` before the record counts as stopped, so its
  answer is in by then) finds nobody: a host that is off. A listener that accepts the knock
  belongs to a process that still exists: one starved of CPU (64 ranks on 2
  cores after a carrier loss: 3.7 s without a run, its beacon thread too)
  refreshes its record again, so it is waited for; one whose kernel keeps
  answering while its record stays unchanged for ``HUNG_FACTOR`` times
  ``LINKESCAPE_PEER_LOST_TIMEOUT`` hangs, and is gone;
- it said so: BYE (closed), or another rank recorded it as the root cause of
  its failure (``PEER_LOST`` frames, the store's failure record).

Silence on every rail, with or without FIN/RST, is not evidence: a host whose
rails are all cut, blackholed or partitioned looks exactly like that. When
the store cannot answer either, the peer is waited for until the no-path
deadline, then ``LinkFailure``.

``Liveness`` only judges: it returns a verdict, and the engine acts on it.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from ..common.errors import LinkFailure, PeerLost


class Verdict:
    __slots__ = ()


class Gone(Verdict):
    """The peer is gone: fail everything with ``error`` and tell the others."""

    __slots__ = ("error", "cause")

    def __init__(self, error: PeerLost, cause: str) -> None:
        self.error = error
        self.cause = cause


class Expired(Verdict):
    """No path for longer than the deadline: fail what needs the peer."""

    __slots__ = ("error",)

    def __init__(self, error: LinkFailure) -> None:
        self.error = error


class ProbeListeners(Verdict):
    """Every link ended with FIN/RST and we accept its links: find out
    whether the peer's listeners still exist."""

    __slots__ = ()


PROBE = ProbeListeners()

log = logging.getLogger("linkescape.engine")

#: how long a knock's answer may take (the recovery thread's connect deadline, and its round)
KNOCK_WAIT = 0.75
#: a knock answered this recently speaks for the peer's process
KNOCK_FRESH = 1.0
#: while the process answers, it is knocked on again this often
KNOCK_INTERVAL = 0.5
#: no knock's result this long after asking (none could be made: our rails all down): the store decides
KNOCK_GIVE_UP = 3 * KNOCK_WAIT
#: a process whose listeners answer but whose record stays unchanged for this many times the
#: peer-lost timeout (from the first knock) hangs: gone
HUNG_FACTOR = 4.0


class _Knock:
    """Knocks on one peer's listeners since its record was found stopped."""

    __slots__ = ("since", "asked", "answered", "unanswered")

    def __init__(self, now: float) -> None:
        self.since = now
        self.asked = now
        #: when a listener last accepted a knock, and when a knock last found nobody (or a refusal)
        self.answered: Optional[float] = None
        self.unanswered: Optional[float] = None


class Liveness:
    def __init__(self, rank: int, nrails: int, config, clock, beacon=None) -> None:
        self.rank = rank
        self.nrails = nrails
        self.config = config
        self.clock = clock
        #: the store's view of peers (None: no store)
        self.beacon = beacon
        #: peer -> rails on which a dial or a probe was refused (nobody listening)
        self.refused: dict = {}
        #: peer -> its knocks, while its record is found stopped and it has no path
        self.knocks: dict = {}
        #: the no-path deadline: ``no_path_timeout``, capped by the group's operation timeout
        #: (torch's ``timeout=``, ``set_timeout``: a call never waits longer for a rank without a path)
        self.no_path_deadline = min(config.no_path_timeout, config.timeout)

    def cap(self, timeout: float) -> None:
        """The group's operation timeout changed: it caps the no-path deadline from now on."""
        self.no_path_deadline = min(self.config.no_path_timeout, timeout)

    def forget(self, rank: int) -> None:
        """``rank`` left the group (a shrink): nothing more is judged of it."""
        self.refused.pop(rank, None)
        self.knocks.pop(rank, None)
        if self.beacon is not None:
            self.beacon.unwatch(rank)

    def check(self, peer: "PeerChannel", now: float) -> Optional[Verdict]:
        """On every timer round for a peer with no path."""
        cfg = self.config
        if peer.lost is not None or peer.no_path_since is None:
            return None
        beacon = self.beacon
        waited = now - peer.no_path_since
        if beacon is not None:
            rx = getattr(peer, "receiver", None)  # (when a frame of it last arrived: its record is no older)
            heard = rx.heard if rx is not None else 0.0
            if heard:
                beacon.watch(peer.rank, heard=self.clock.wall() - (now - heard))
            else:
                beacon.watch(peer.rank)
            age = beacon.record_age(peer.rank, now)
            k = self.knocks.get(peer.rank)
            if k is not None and (age is None or age < now - k.since):
                del self.knocks[peer.rank]  # its record moved since the knocks began (or no evidence now)
            if age is not None:
                # the knock starts KNOCK_WAIT before the record would be called stopped, so that its
                # answer is in by then: it adds nothing to the verdict on a host that is off
                stale = beacon.stale_after(cfg.peer_lost_timeout)
                if age >= stale - KNOCK_WAIT and waited > cfg.peer_lost_timeout - KNOCK_WAIT:
                    verdict = self._knock(peer, now, age >= stale and waited > cfg.peer_lost_timeout)
                    if verdict is not None:
                        return verdict
        if waited > self.no_path_deadline:
            return self.expired(peer, now)
        if peer.eof_since is not None and self.rank < peer.rank:
            return PROBE
        return None

    def expired(self, peer: "PeerChannel", now: float) -> Expired:
        """The verdict on a peer past the no-path deadline (or past the group's timeout: see
        ``Engine._timed_out``)."""
        since = self.clock.wall() - (now - peer.no_path_since)
        return Expired(LinkFailure(f"no path to rank {peer.rank} on any rail {list(range(self.nrails))} since "
                                   f"{time.strftime('%H:%M:%S', time.localtime(since))}", peer=peer.rank,
                                   rails=list(range(self.nrails)), since=since))

    def _knock(self, peer: "PeerChannel", now: float, stopped: bool) -> Optional[Verdict]:
        """The record is stopping (``stopped``: it stopped): knock on the peer's listeners before
        calling it gone (PROBE asks the recovery thread for one connect per rail;
        ``listener_probed`` brings the answers)."""
        cfg = self.config
        k = self.knocks.get(peer.rank)
        if k is None:
            self.knocks[peer.rank] = _Knock(now)
            return PROBE
        if k.answered is not None and now - k.answered <= KNOCK_FRESH:
            # its kernel accepted a connection on a listener: the process exists (starved, or hung)
            if stopped and now - k.since > HUNG_FACTOR * cfg.peer_lost_timeout:
                return Gone(PeerLost(f"rank {peer.rank} has no path on any rail and has not refreshed its liveness "
                                     f"record in the store for over {HUNG_FACTOR * cfg.peer_lost_timeout:g}s while "
                                     f"its listeners still accept connections: its process hangs",
                                     peer=peer.rank), "timeout")
            if now - k.asked >= KNOCK_INTERVAL:
                k.asked = now
                return PROBE
            return None
        if now - k.asked <= KNOCK_WAIT or not stopped:
            return None  # the answer may still come (or the record has not stopped yet)
        if (k.unanswered is None or k.unanswered < k.asked) and now - k.asked <= KNOCK_GIVE_UP:
            return None  # no knock was made yet (every probe slot busy): the verdict waits for one
        return Gone(PeerLost(f"rank {peer.rank} has no path on any rail, stopped refreshing its liveness record in "
                             f"the store for {cfg.peer_lost_timeout:g}s and its listeners do not answer: its process "
                             f"or host is gone", peer=peer.rank), "timeout")

    def link_up(self, peer: "PeerChannel", rail: int) -> None:
        """A link to ``peer`` on ``rail`` is up again: someone listens there."""
        rails = self.refused.get(peer.rank)
        if rails:
            rails.discard(rail)

    def path_back(self, peer: "PeerChannel") -> None:
        self.knocks.pop(peer.rank, None)
        if self.beacon is not None:
            self.beacon.unwatch(peer.rank)

    def listener_probed(self, peer: "PeerChannel", rail: int, refused: bool,
                        answered: bool = False) -> Optional[Verdict]:
        """A dial or a probe of ``peer``'s listener on ``rail`` was refused
        (nobody listens), ``answered`` (its kernel accepted the connection),
        or neither (nothing came back in time)."""
        k = self.knocks.get(peer.rank)
        if k is not None and not answered:
            k.unanswered = self.clock.now()
        if answered:
            if k is not None:
                if k.answered is None:
                    log.warning("rank %d has no path and its store record is not moving, but its listener on rail %d "
                                "accepts connections: its process exists (starved of CPU, or hung); waiting",
                                peer.rank, rail)
                k.answered = self.clock.now()
        rails = self.refused.setdefault(peer.rank, set())
        if refused:
            rails.add(rail)
        else:
            rails.discard(rail)
        # Nobody listens on any rail while our NICs are fine: the process is gone.
        if peer.no_path_since is not None and peer.lost is None and len(rails) == self.nrails:
            return Gone(PeerLost(f"rank {peer.rank} closed every link and refuses connections on every rail",
                                 peer=peer.rank), "socket_error")
        return None

    @staticmethod
    def reported(by: int, lost_rank: int) -> PeerLost:
        """Rank ``by`` told us (a PEER_LOST frame) that ``lost_rank`` is gone."""
        return PeerLost(f"rank {lost_rank} is lost (reported by rank {by})", peer=lost_rank)

    @staticmethod
    def recorded(record: dict) -> Optional[PeerLost]:
        """The store's failure record (read by the Beacon, checked by it)."""
        try:
            lost_rank = int(record["peer"])
        except (KeyError, TypeError, ValueError):
            return None
        return PeerLost(f"rank {lost_rank} is lost (recorded by rank {record.get('by')}: {record.get('why', '')})",
                        peer=lost_rank)


__all__ = ["Liveness", "Verdict", "Gone", "Expired", "ProbeListeners", "PROBE"]
