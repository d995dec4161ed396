"""A peer's timers, as a part of ``PeerChannel`` (``peer.py``): what the engine's timer round
asks of a peer it keeps hot. Silent-loss detection on the links with bytes in flight, heartbeats
while an operation's traffic is pending (or a rail is held out), the follow-up frame behind a lone
probe, the relay's heartbeats, silence and resends, the grey-failure hold's samples, fail-back.

Nothing here runs per idle link: a peer is looked at only while the engine keeps it hot (traffic,
a fault, a probe's acknowledgement awaited); see docs/architecture.md, "What a rank costs, as a
function of N".
"""

from __future__ import annotations

import logging
from typing import Optional

from ..protocol.frames import DATA, HEARTBEAT, NOTIFY_SILENT
from ..protocol.linkstate import Ev, State
from ..protocol.paths import CALM_AFTER, judge_silence
from ..transport.tcp import tcp_info_summary
from .link import Link

log = logging.getLogger("linkescape.engine")

# (bits of a HEARTBEAT's arg: protocol/paths.py, AVOID_MASK and LOAD_SHIFT)


class PeerTimers:
    """The clock-driven half of a ``PeerChannel`` (a base class of it: the same object, its
    state defined in ``PeerChannel.__init__``)."""

    def engaged(self) -> bool:
        """An operation's traffic is pending with this peer: bytes to send or
        to be acknowledged, or a receive posted."""
        return self.sender.busy or bool(self.outbound.unacked) or self.receiver.waiting()

    def quiet(self, now: float, watched: bool) -> bool:
        """Nothing for the timers to do with this peer until it is touched
        again (traffic, a state change) or the probe budget picks one of
        its links: no operation's traffic, no ack owed, no bytes of ours
        waiting for an acknowledgement, and settled (below)."""
        if watched or self.engaged() or self.inbound.ack_owed:
            return False
        for link in self.links:
            if link is not None and (link.pending_since is not None or link.out):
                return False
        return self.settled(now)

    def settled(self, now: float) -> bool:
        """No fault being handled, no rail in hold-down, the path the policy
        would choose: the timers of a busy peer run only when one of its
        deadlines is due (``tick``); an unsettled one is looked at often."""
        if self.receiver.stash:
            return False
        for link in self.links:
            if link is not None and (link.parked or link.hdr is not None):
                return False
        return self.paths.settled(now)

    def calm(self, now: float, watched: bool) -> bool:
        """No link of this rank went down for ``CALM_AFTER`` seconds, no fault is handled with this
        peer and it is not watched: its backups beat every ``CALM_BEAT`` while it is busy
        (``PeerPaths.beat_every``). At 64 ranks on 2 cores those beats were a third of a small
        call's CPU (docs/benchmarks.md)."""
        return not watched and now - self.env.fault_at >= CALM_AFTER and not self.paths.faulted()

    def _beat_arg(self) -> int:
        return self.paths.beat_arg(self.env.relaying)

    def _beat(self, link: Optional[Link] = None) -> None:
        """A heartbeat (our avoid bits and relay load) on ``link``, or on the active path."""
        if link is None:
            self.sender.send_control(HEARTBEAT, arg=self._beat_arg())
        else:
            self.sender.control(link, HEARTBEAT, arg=self._beat_arg())

    def probe(self, rail: int, now: float) -> Optional[Link]:
        """Give an idle link something to acknowledge (the probe budget);
        the link probed, or None."""
        link = self.links[rail]
        if link is None or self.status[rail].state is not State.UP or link.out:
            return None
        self._beat(link)
        if link.pending_since is None:
            link.pending_since = now
        return link

    def tick(self, now: float, blind: bool, due: float, watched: bool):
        """The timers of a hot peer: silent-loss detection on every live
        link, heartbeats on them while an operation's traffic is pending (or
        the rail is held out: its cleanliness is judged from them, or the
        peer is watched closely), a link parked for long read on into the
        stash, the relay's heartbeats and silence, fail-back. Returns (when
        this peer next needs the timers, ``due`` if nothing is sooner;
        outcomes)."""
        due = self.receiver.stash_parked(now, due)
        cfg = self.env.config
        hb = cfg.heartbeat_interval
        engaged = watched or self.engaged()
        calm = engaged and self.calm(now, watched)
        for link in self.links:
            if link is None or self.status[link.rail].state is not State.UP:
                continue
            # silence can only be found on bytes written since the last check
            # found everything acknowledged, and not before it could pass the timeout
            if (link.pending_since is not None and (blind or now >= link.silent_at)
                    and self._silent(link, now, blind)):
                self.link_down(link, Ev.TIMEOUT, detail=f"no acknowledgement for {now - link.pending_since:.3f}s "
                                                        f"({self._tcp_summary(link)})")
                # the other end would find out only at its own next check
                self._notify(NOTIFY_SILENT, link.rail)
                continue
            iv = self.paths.beat_every(link.rail, engaged, hb, calm)
            beats = iv is not None
            if beats and now - link.last_sent >= iv and not link.out:
                self._beat(link)
            elif link.pending_since is not None and now - link.last_sent >= hb - 1e-6 and not link.out:
                self._follow_up(link)
            if link.pending_since is not None:
                due = min(due, link.silent_at)
                if not beats:
                    # (a link with bytes queued, its socket full, follows up once they are out)
                    due = min(due, (max(link.last_sent, now) if link.out else link.last_sent) + hb)
            if beats:
                # (a link with bytes queued beats once they are out)
                due = min(due, max(link.last_sent, now) + iv if link.out else link.last_sent + iv)
        if self.relay is not None:
            due = self.paths.relay_tick(now, hb, self.outbound.acked, len(self.outbound.unacked),
                                        any(l.out for l in self.sender.links()), due)
            self._apply_paths()
            if self.sender.replay:
                self.sender.pump()
        if self.inbound.ack_owed:
            if now >= self.receiver.ack_due:
                self.sender.send_ack()
            else:
                due = min(due, self.receiver.ack_due)
        return due, self._done()

    def _follow_up(self, link: Link) -> None:
        """Bytes of ours (a probe, the last frames of an operation) went out a
        heartbeat interval ago on a link that does not beat: acknowledged by
        now, the link is not watched any more; still waiting, it gets one more
        frame. A lone segment lost on a healthy path (a queue that overflowed)
        is sent again by the kernel only after ~250 ms (measured; a loss probe
        waits out the delayed-ack bound when one segment is in flight, and so
        does the minimum retransmission timeout): past the silent timeout, so
        that one loss would read as a dead link. The frame behind it draws
        the peer kernel's duplicate ack at once (and a fast retransmission),
        where a dead path stays silent."""
        try:
            silent = self.env.ack_silence(link.sock)
        except OSError:
            return  # the silence check finds out
        if silent is None:
            link.pending_since = None
        else:
            self._beat(link)

    def _tcp_summary(self, link: Link) -> str:
        try:
            return tcp_info_summary(link.sock)
        except OSError as exc:
            return str(exc)

    def handling(self) -> bool:
        """A fault is being handled with this peer (no path, a relay, EOF, a
        rail held out, frames stashed or parked, a link not up): the timers
        keep their fine cadence for it."""
        if self._faulted():
            return True
        return any(link is None or link.parked or self.status[link.rail].state is not State.UP
                   for link in self.links)

    def _faulted(self) -> bool:
        """No path, a relay, EOF, a rail held out (by either end), frames stashed."""
        return self.paths.faulted() or bool(self.receiver.stash)

    def receiving(self) -> bool:
        """A frame is half read on one of our links (its sender waits for us to read on). A parked
        DATA frame is not: it waits for a receive to be posted (by a caller, who drives it then, or
        by an async op, which is work of its own) or for a frame such a receive needs first, and the
        timers read a long-parked one into the stash. (A parked RELAY frame waits for the relay's
        window, which acknowledgements on other links open: that is work.)"""
        for link in self.links:
            if link is not None and link.hdr is not None and not (link.parked and link.hdr.kind == DATA):
                return True
        return False

    def hold_sample(self, link: Link, now: float, retrans_segs: int, data_segs: int):
        """A held (degraded or silent) rail's link carries heartbeats: is it clean yet?"""
        if self.paths.hold_sample(link.rail, now, retrans_segs, data_segs):
            log.info("rank %d rail %d: clean again after %.1fs", self.rank, link.rail, self.holds[link.rail].length)
            self._apply_paths()
            self.sender.pump()
        return self._done()

    def degraded(self, link: Link):
        """The grey-failure verdict (engine): take the link down, hold the rail."""
        rate = link.grey.last_rate or 0.0
        ref = link.grey.rail.reference
        self.link_down(link, Ev.DEGRADED, detail=f"goodput {rate * 8 / 1e6:.1f} Mbit/s against a healthy "
                                                 f"{ref * 8 / 1e6:.1f} Mbit/s for {link.grey.window:g}s")
        return self._done()

    def other_clean_rail(self, rail: int) -> bool:
        return self.paths.other_clean_rail(rail)

    def _silent(self, link: Link, now: float, blind: bool) -> bool:
        """Silent loss on ``link``? The kernel says how long our bytes wait for the peer's
        kernel's acknowledgement (TCP_INFO); ``judge_silence`` (protocol/paths.py) decides."""
        try:
            silent = self.env.ack_silence(link.sock)
        except OSError:
            silent = None
        cfg = self.env.config
        verdict, follow_up, link.pending_since, link.silent_at = judge_silence(
            now, silent, blind, link.pending_since, link.last_sent, bool(link.out), cfg.silent_timeout,
            cfg.heartbeat_interval)
        if follow_up:
            self._beat(link)
        return verdict

    def failback(self, now: float):
        """Move traffic back to a better rail (or from a relay to a rail)
        once it is eligible again (``PeerPaths.failback``)."""
        if self.paths.failback(now):
            self._apply_paths()
            self.sender.pump()
        return self._done()
