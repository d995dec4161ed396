"""One connected peer, as Gloo's Pair: it owns its links (one per rail), the
reliable channel of both directions, and its data path (``tx``: a Sender,
``rx``: a Receiver). The engine drives it; algorithms never see it.

Links of a peer are interchangeable: DATA frames are numbered per peer, so
when a link goes down everything unacknowledged is replayed on another one
(``link_down`` -> ``reroute``), and the receiver applies each frame once.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from ..errors import LinkEscapeError, PeerLost, ProtocolError
from ..protocol.channel import RecvChannel, SendChannel
from ..protocol.frames import Header, Kind
from ..protocol.grey import GreyDetector, Hold
from ..protocol.linkstate import Ev, LinkStatus, State
from ..protocol.railstate import PeerRails
from ..transport.tcp import ack_silence, tcp_info_summary
from .io import POLLERR, POLLIN, POLLOUT
from .link import Link, is_disconnect
from .receiver import Receiver, Unexpected
from .sender import Sender

if TYPE_CHECKING:
    from .core import Engine

log = logging.getLogger("linkescape.engine")

CAUSE = {ev: ev.value for ev in (Ev.CARRIER_DOWN, Ev.PEER_CARRIER_DOWN, Ev.SOCKET_ERROR, Ev.TIMEOUT,
                                 Ev.PROTOCOL_ERROR, Ev.DEGRADED)}

__all__ = ["PeerChannel", "Unexpected", "CAUSE"]

#: a peer whose links carry nonsense this many times within the window fails the communicator
PROTOCOL_ERROR_LIMIT = 3
PROTOCOL_ERROR_WINDOW = 60.0


def failure_event(exc: BaseException) -> Ev:
    """ETIMEDOUT: the kernel gave up on unacknowledged data (TCP_USER_TIMEOUT),
    a silent path like the one our own detector finds; anything else ended
    the connection."""
    return Ev.TIMEOUT if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT else Ev.SOCKET_ERROR


class PeerChannel:
    def __init__(self, host: "Engine", rank: int, nrails: int) -> None:
        self.host = host
        self.rank = rank
        self.send = SendChannel()
        self.recv = RecvChannel()
        self.links: List[Optional[Link]] = [None] * nrails
        self.status: List[LinkStatus] = [LinkStatus(rail=r) for r in range(nrails)]
        self.tx = Sender(self)
        self.rx = Receiver(self)
        #: rails that carry our traffic now, best first (empty: no path)
        self.active: List[int] = []
        self.no_path_since: Optional[float] = None
        self.closed_by_peer = False
        #: when the last link ended with FIN/RST (a dead process, or a peer
        #: that dropped links it believed dead and will re-dial)
        self.eof_since: Optional[float] = None
        #: rails on which re-dialing was refused (nobody listening)
        self.refused: set = set()
        self.lost: Optional[BaseException] = None
        #: whether each rail's NIC on the peer's side lost carrier (from the
        #: rail word every frame of the peer carries, and its notifications)
        self.peer_carrier_down: Dict[int, bool] = {}
        self.peer_rails = PeerRails()
        #: grey failure: rails held out of service (degraded) by us, and by the
        #: peer (from its heartbeats: level state), as bitmasks
        self.avoid = 0
        self.peer_avoid = 0
        self.holds: List[Hold] = [Hold(base=host.config.failback_holddown) for _ in range(nrails)]
        #: when links to this peer carried nonsense (ProtocolError), recently
        self.protocol_errors: List[float] = []
        #: bytes moved by this peer's links that are closed now, per rail
        self.closed_sent: List[int] = [0] * nrails
        self.closed_received: List[int] = [0] * nrails

    # ------------------------------------------------------------ views
    def live_links(self) -> List[Link]:
        return [l for l in self.links if l is not None and l.status.state is State.UP]

    def rail_bytes(self, rail: int) -> tuple:
        """(sent, received) on ``rail`` over every link ever opened to this peer."""
        link = self.links[rail]
        sent, received = self.closed_sent[rail], self.closed_received[rail]
        if link is not None:
            sent += link.bytes_sent
            received += link.bytes_received
        return sent, received

    # ------------------------------------------------------------ links
    def attach(self, link: Link, now: float) -> None:
        """Put a link in service (start-up, or an emulated repair)."""
        old = self.links[link.rail]
        if old is not None:
            self.drop(old)
        self.links[link.rail] = link
        self.host.io.add_link(link)
        self.host.down.discard((self.rank, link.rail))
        self.host.touch(self)
        self._whole_again()
        self._watch(link, now)
        self.reroute(now)

    def adopt(self, link: Link, peer_expected: int) -> None:
        """A re-opened link (either side dialed): put it in service."""
        now = time.monotonic()
        old = self.links[link.rail]
        if old is not None:
            # the peer re-dialed, so it considers the old connection dead
            self.link_down(old, Ev.SOCKET_ERROR, detail="replaced by a new connection")
        cause = link.status.down_cause
        link.status.apply(Ev.CONNECTED, now)
        self.links[link.rail] = link
        self.host.io.add_link(link)
        self.host.down.discard((self.rank, link.rail))
        self.host.touch(self)  # hot through the hold-down, then failback
        self._whole_again()
        self._watch(link, now)
        self.eof_since = None
        self.refused.discard(link.rail)
        if self.send.acked < peer_expected - 1 <= self.send.last_seq:
            self.send.on_ack(peer_expected - 1)  # the peer has all below: replay less
        self.host.emit("link_up", self.rank, link.rail, CAUSE.get(cause), epoch=link.epoch)
        self.reroute(now, cause=CAUSE.get(cause))
        self.tx.pump()

    def _whole_again(self) -> None:
        if all(st.state is State.UP for st in self.status):
            self.host.degraded_watch.discard(self)

    def _watch(self, link: Link, now: float) -> None:
        link.grey = GreyDetector(self.host.rail_rates[link.rail])
        self.holds[link.rail].new_link(now)
        if self.avoid:
            # tell the peer at once which rails we hold out (heartbeats repeat it)
            self.tx.control(link, Kind.HEARTBEAT, arg=self.avoid)

    def drop(self, link: Link, close: bool = True) -> None:
        log.debug("drop link to rank %d rail %d (fd %d)", link.peer, link.rail, link.fd)
        self.host.io.remove_link(link)
        if self.links[link.rail] is link:
            self.links[link.rail] = None
            self.closed_sent[link.rail] += link.bytes_sent
            self.closed_received[link.rail] += link.bytes_received
        if close:
            link.close()
        else:
            self.host.severed.append(link)  # an emulated cut: silent, as a real one

    def link_down(self, link: Link, ev: Ev, detail: str = "", close: bool = True) -> None:
        """A link failed: drop it and move its traffic (lossless: replay).
        ``close=False`` keeps the socket open but unused (an emulated cut must
        not send a FIN that a real cut never delivers)."""
        now = time.monotonic()
        was_active = link.rail in self.active
        if ev in (Ev.TIMEOUT, Ev.DEGRADED):
            # back only once clean: a lossy rail must not flap
            self.holds[link.rail].trip(now)
            self.avoid |= 1 << link.rail
        link.status.apply(ev, now, backoff_max=self.host.config.reconnect_max)
        self.drop(link, close=close)
        host = self.host
        host.down.add((self.rank, link.rail))
        host.touch(self)
        host.rail_lost(self)
        self.host.emit("link_down", self.rank, link.rail, CAUSE[ev], detail=detail)
        self.tx.replay = True
        # A link parked on a frame ahead may have waited for this one.
        self.resume_parked()
        self.reroute(now, cause=CAUSE[ev], moved_from=link.rail if was_active else None)
        self.host.redial()  # Recovery sleeps until a link is down

    def reroute(self, now: float, cause: Optional[str] = None, moved_from: Optional[int] = None) -> None:
        host = self.host
        old = self.active
        new = host.policy.choose(self.status, now, self.avoid | self.peer_avoid)
        self.active = new
        if not new:
            if self.no_path_since is None:
                self.no_path_since = now
                host.emit("no_path", self.rank, moved_from if moved_from is not None else -1,
                          cause or "socket_error", since=time.time())
            return
        if self.no_path_since is not None:
            self.no_path_since = None
            self.tx.replay = True
            host.liveness.path_back(self)
        if moved_from is not None:
            self.tx.replay = True  # what was on the dead link is lost: resend all unacked
        if old and new != old:
            if moved_from is not None:
                host.emit("failover", self.rank, new[0], cause or "socket_error", from_rail=moved_from)
            elif new[0] == host.policy.primary or (host.policy.stripe and len(new) > len(old)):
                host.emit("failback", self.rank, new[0], None, from_rail=old[0])
        elif not old and moved_from is not None:
            host.emit("failover", self.rank, new[0], cause or "socket_error", from_rail=moved_from)

    def notify(self, kind: int, rail: int) -> None:
        """Tell the peer about our NIC on ``rail`` over another rail, if one is left."""
        links = [l for l in self.live_links() if l.rail != rail]
        if not links:
            return
        link = next((l for l in links if l.rail in self.active), links[0])
        self.tx.control(link, kind, arg=rail)

    def resume_parked(self) -> None:
        try:
            self.rx.resume_parked()
        except LinkEscapeError as exc:
            self.host.set_fatal(exc)

    # ------------------------------------------------------------ poll events
    def on_event(self, link: Link, ev: int) -> None:
        io = self.host.io
        if link.parked and ev & POLLERR:
            # A parked link is not read, so an error would go unseen.
            import os
            import socket as _socket

            err = link.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
            self.on_disconnect(link, ConnectionResetError(
                err, f"error on a parked link: poll {ev:#x}, {os.strerror(err) if err else 'no error'}"))
            return
        if ev & POLLIN or (ev & POLLERR and not ev & POLLOUT):
            self.on_readable(link)
            if io.links.get(link.fd) is not link:
                return
        if ev & POLLOUT:
            self.tx.flush(link)
        elif ev & POLLERR and io.links.get(link.fd) is link:
            self.on_disconnect(link, ConnectionResetError("POLLERR/POLLHUP"))

    def on_readable(self, link: Link) -> None:
        try:
            self.rx.on_readable(link)
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as exc:
            self.protocol_error(link, exc)
        except LinkEscapeError as exc:  # the ranks disagree (CollectiveMismatch): the job is wrong
            self.host.set_fatal(exc)
            # stop reading this link: its frame has nowhere to go (a hang-up still shows)
            link.reset_read()
            link.parked = True
            self.host.io.want(link, POLLOUT if link.out else 0)
        except Exception as exc:  # OSError, LinkClosed
            if is_disconnect(exc):
                self.on_disconnect(link, exc)
            else:
                raise

    def protocol_error(self, link: Link, exc: ProtocolError) -> None:
        """The link carried nonsense: it is a failed link (closed, replayed
        elsewhere, re-dialed). Only a peer that keeps sending nonsense on fresh
        links fails the communicator."""
        now = time.monotonic()
        self.protocol_errors = [t for t in self.protocol_errors if now - t < PROTOCOL_ERROR_WINDOW] + [now]
        log.warning("rank %d rail %d: %s", self.rank, link.rail, exc)
        if self.links[link.rail] is link:
            self.link_down(link, Ev.PROTOCOL_ERROR, detail=str(exc))
        if len(self.protocol_errors) >= PROTOCOL_ERROR_LIMIT:
            self.host.set_fatal(ProtocolError(
                f"rank {self.rank} sent frames that break the protocol on {len(self.protocol_errors)} links "
                f"within {PROTOCOL_ERROR_WINDOW:g}s (last: {exc})", peer=self.rank, rail=link.rail))

    def on_disconnect(self, link: Link, exc: BaseException) -> None:
        if self.closed_by_peer:
            self.drop(link)
            return
        self.link_down(link, failure_event(exc), detail=f"{type(exc).__name__}: {exc}")
        # Every link ended with FIN/RST. A dead process also lost its listener:
        # the dialing side learns that at once (connection refused on every
        # rail); the accepting side waits briefly for a re-dial, which a live
        # peer that merely dropped a link it believed dead would make.
        if not self.live_links() and self.lost is None and self.eof_since is None:
            self.eof_since = time.monotonic()
            if self.host.rank > self.rank:
                for st in self.status:
                    if st.state is State.DOWN:
                        st.next_probe = time.monotonic()
                self.host.redial()

    def on_control(self, link: Link, hdr: Header) -> None:
        host = self.host
        if hdr.kind == Kind.BYE:
            # The peer drained before saying BYE: whatever we still wait for
            # from it will never come.
            self.closed_by_peer = True
            self.lost = PeerLost(f"rank {self.rank} closed its communicator", peer=self.rank)
            host.ops.fail_needing(self, self.lost)
        elif hdr.kind == Kind.NOTIFY_DOWN:
            other = self.links[hdr.arg] if hdr.arg < len(self.links) else None
            self.peer_carrier_down[hdr.arg] = True
            if other is not None:
                self.link_down(other, Ev.PEER_CARRIER_DOWN, detail="peer NIC lost carrier")
        elif hdr.kind == Kind.NOTIFY_SILENT:
            other = self.links[hdr.arg] if hdr.arg < len(self.links) else None
            if other is not None:
                self.link_down(other, Ev.TIMEOUT, detail="the peer found the link silent")
        elif hdr.kind == Kind.HEARTBEAT:
            if hdr.arg != self.peer_avoid:
                self.peer_avoid = hdr.arg & 0xFF
                now = time.monotonic()
                self.reroute(now)
                self.tx.pump()
        elif hdr.kind == Kind.PEER_LOST:
            host.liveness.reported(self.rank, hdr.arg)
        elif hdr.kind == Kind.NOTIFY_UP:
            self.peer_carrier_down[hdr.arg] = False
            if hdr.arg < len(self.status) and self.status[hdr.arg].state is State.DOWN:
                self.status[hdr.arg].next_probe = time.monotonic()
                self.status[hdr.arg].backoff = 0.0
                host.redial()

    def on_peer_rails(self, word: int) -> None:
        """The peer's rails without carrier, as every frame repeats them."""
        down, up = self.peer_rails.apply(word)
        now = time.monotonic()
        for rail in down:
            if rail < len(self.links):
                self.peer_carrier_down[rail] = True
                link = self.links[rail]
                if link is not None:
                    self.link_down(link, Ev.PEER_CARRIER_DOWN, detail="peer NIC lost carrier")
        for rail in up:
            if rail < len(self.links):
                self.peer_carrier_down[rail] = False
                st = self.status[rail]
                if st.state is State.DOWN:
                    st.next_probe = now
                    st.backoff = 0.0
                    self.host.redial()

    # ------------------------------------------------------------ timers
    def engaged(self) -> bool:
        """An operation's traffic is pending with this peer: bytes to send or
        to be acknowledged, or a receive posted."""
        return self.tx.busy or bool(self.send.unacked) or self.rx.waiting()

    def quiet(self, now: float) -> bool:
        """Nothing for the timers to do with this peer until it is touched
        again (traffic, a state change) or the probe budget picks one of
        its links: no operation's traffic, no ack owed, no bytes of ours
        waiting for an acknowledgement, no fault being handled, no rail in
        hold-down, the path the policy would choose."""
        if (self.engaged() or self.recv.ack_owed or self.no_path_since is not None
                or self.avoid or self.peer_avoid or self.rx.stash or self.eof_since is not None
                or self in self.host.degraded_watch):
            return False
        for link in self.links:
            if link is not None and (link.pending_since is not None or link.parked or link.out):
                return False
        policy = self.host.policy
        for st in self.status:
            if st.state is State.UP and not policy.eligible(st, now):
                return False
        return policy.choose(self.status, now, 0) == self.active

    def probe(self, rail: int, now: float) -> bool:
        """Give an idle link something to acknowledge (the probe budget)."""
        link = self.links[rail]
        if link is None or link.status.state is not State.UP or link.out:
            return False
        self.tx.control(link, Kind.HEARTBEAT, arg=self.avoid)
        if link.pending_since is None:
            link.pending_since = now
        return True

    def tick(self, now: float, blind: bool, due: float) -> float:
        """Silent-loss detection on every live link of this (hot) peer,
        heartbeats on them while an operation's traffic is pending (or the
        rail is held out: its cleanliness is judged from them); a link
        parked for long is read on into the stash. Returns when this peer
        next needs the timers (``due`` if nothing is sooner): the moment a
        link's silence could pass the timeout, the next heartbeat."""
        self.rx.stash_parked(now)
        cfg = self.host.config
        hb = cfg.heartbeat_interval
        engaged = self.engaged() or self in self.host.degraded_watch
        for link in self.links:
            if link is None or link.status.state is not State.UP:
                continue
            if self._silent(link, now, blind):
                self.link_down(link, Ev.TIMEOUT, detail=f"no acknowledgement for "
                                                        f"{now - link.pending_since:.3f}s "
                                                        f"({tcp_info_summary(link.sock)})")
                # the other end would find out only at its own next check
                self.notify(Kind.NOTIFY_SILENT, link.rail)
                continue
            beats = engaged or self.avoid >> link.rail & 1
            if beats and now - link.last_sent >= hb and not link.out:
                self.tx.control(link, Kind.HEARTBEAT, arg=self.avoid)
            if link.pending_since is not None:
                due = min(due, link.silent_at)
            if beats:
                # (a link with bytes queued beats once they are out)
                due = min(due, max(link.last_sent, now) + hb if link.out else link.last_sent + hb)
        return due

    def handling(self) -> bool:
        """A fault is being handled with this peer (no path, EOF, a rail
        held out, frames stashed or parked, a link not up): the timers keep
        their fine cadence for it."""
        if (self.no_path_since is not None or self.eof_since is not None or self.avoid or self.peer_avoid
                or self.rx.stash):
            return True
        return any(link is None or link.parked or link.status.state is not State.UP for link in self.links)

    def hold_sample(self, link: Link, now: float, retrans_segs: int) -> None:
        """A held (degraded or silent) rail's link carries heartbeats: is it clean yet?"""
        hold = self.holds[link.rail]
        if hold.sample(now, retrans_segs):
            self.avoid &= ~(1 << link.rail)
            log.info("rank %d rail %d: clean again after %.1fs", self.rank, link.rail, hold.length)
            self.failback(now)

    def degraded(self, link: Link) -> None:
        """The grey-failure verdict (engine): take the link down, hold the rail."""
        rate = link.grey.last_rate or 0.0
        ref = link.grey.rail.reference
        self.link_down(link, Ev.DEGRADED, detail=f"goodput {rate * 8 / 1e6:.1f} Mbit/s against a healthy "
                                                 f"{ref * 8 / 1e6:.1f} Mbit/s for {link.grey.window:g}s")

    def other_clean_rail(self, rail: int) -> bool:
        held = self.avoid | self.peer_avoid
        return any(l.rail != rail and not held >> l.rail & 1 for l in self.live_links())

    def _silent(self, link: Link, now: float, blind: bool) -> bool:
        """Silent loss: our bytes (data or a heartbeat) wait for the peer's
        kernel to acknowledge them for longer than the silent timeout. Kernel
        acks keep coming while the peer process is busy, so only the path can
        trip this. Silence counts from when bytes were first seen waiting,
        not from the last ack: after a pause the last ack is old although the
        byte just went out."""
        try:
            silent = ack_silence(link.sock)
        except OSError:
            silent = None
        timeout = self.host.config.silent_timeout
        if silent is None or blind:
            link.pending_since = None if silent is None else now
            link.silent_at = now + timeout
            return False
        if link.pending_since is None:
            link.pending_since = now
        quiet_for = min(silent, now - link.pending_since)
        # the earliest this silence can pass the timeout: check again then
        link.silent_at = now + max(timeout - quiet_for, 0.001)
        return quiet_for > timeout

    def failback(self, now: float) -> None:
        """Move traffic back to a better rail once it is eligible again."""
        if self.active and self.host.policy.choose(self.status, now, self.avoid | self.peer_avoid) != self.active:
            self.reroute(now)
            self.tx.pump()

    # ------------------------------------------------------------ state for operators
    def snapshot(self, now: float) -> dict:
        links = []
        for rail, st in enumerate(self.status):
            sent, received = self.rail_bytes(rail)
            links.append({
                "rail": rail,
                "state": st.state.value,
                "usable": st.state is State.UP and self.links[rail] is not None,
                "active": rail in self.active,
                "bytes_sent": sent,
                "bytes_received": received,
                "failures": st.failures,
                "down_cause": CAUSE.get(st.down_cause),
                "since_s": now - st.since if st.since else None,
            })
        return {
            "peer": self.rank,
            "primary": self.active[0] if self.active else None,
            "active": list(self.active),
            "sent": self.send.last_seq,
            "acked": self.send.acked,
            "received": self.recv.cumulative_ack,
            "unacked_bytes": self.send.inflight_bytes,
            "replayed_bytes": self.tx.replayed_bytes,
            "no_path_s": None if self.no_path_since is None else now - self.no_path_since,
            "lost": None if self.lost is None else f"{type(self.lost).__name__}: {self.lost}",
            "links": links,
        }
