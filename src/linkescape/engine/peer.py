"""One connected peer, as Gloo's Pair: it owns its links (one per rail), the
reliable channel of both directions, its data path (``sender``: a Sender,
``receiver``: a Receiver), and its paths (``paths``: a
``protocol.paths.PeerPaths``, the escape policy of the pair: link states,
holds, the route over its rails or through a relay). This is the I/O shell
around ``paths``: it tells it what the links did, and carries out what it
decides (``_apply_paths``); the engine reads the route, never writes it.

A peer never reaches into the engine. What it needs is given to it when it
is built (``PeerEnv``: config, clock, policy, descriptors, the rank's rail
word and rail rates, the matcher of any-source receives and collective
starts); what the rest of the rank must do it reports as outcomes
(``outcomes.py``), returned by every call the engine makes into it.

Links of a peer are interchangeable: DATA frames are numbered per peer, so
when a link goes down everything unacknowledged is replayed on another path
(``link_down`` -> ``PeerPaths.failed``, which reroutes), and the receiver applies each frame once.
"""

from __future__ import annotations

import errno
import logging
from typing import List, Optional

from ..common.errors import FrameAuthError, LinkEscapeError, PeerLost, ProtocolError
from ..protocol.channel import RecvChannel, SendChannel
from ..protocol import paths as P
from ..protocol.frames import (BYE, HEARTBEAT, NOTIFY_DOWN, NOTIFY_SILENT, NOTIFY_STALE, NOTIFY_UP, PEER_LOST,
                               RELAY_RESET, RELAY_UNREACH, Header, unpack_header, HEADER_SIZE, DATA, RELAY)
from ..protocol.grey import GreyDetector
from ..protocol.linkstate import Ev, State
from ..protocol.paths import CAUSE, LOAD_SHIFT, PeerPaths
from ..protocol.relaymac import Unknown
from ..transport.tcp import ack_now
from .io import POLLERR, POLLIN, POLLOUT
from .link import Link, is_disconnect
from .outcomes import (NOTHING, Closed, Emit, Fatal, LinkDown, LinkUp, LostReported, NoPath, PathBack, RelayEnded,
                       Redial, RelayReset, Unreachable)
from .receiver import RESEND, Heard, Receiver, Unexpected
from .peer_timers import PeerTimers
from .sender import Sender
from .env import PeerEnv

log = logging.getLogger("linkescape.engine")

__all__ = ["PeerChannel", "Unexpected", "CAUSE", "failure_event"]

#: a peer whose links carry nonsense this many times within the window fails the communicator
PROTOCOL_ERROR_LIMIT = 3
PROTOCOL_ERROR_WINDOW = 60.0
#: While a peer has no rail and no relay (stranded), a re-dial's connect is given up after this
#: and the next one starts at most STRANDED_BACKOFF later: a SYN sent into a black hole is sent
#: again by the kernel only after 1 s, and with the usual half-second connect and back-off a rail
#: repaired just after a dial began was found up to a second late, the pair waiting all that time
#: (a ring step of 724 ms in the hour of seed 257: its other rail was cut 0.1 s after the repair).
STRANDED_CONNECT = 0.15
STRANDED_BACKOFF = 0.1


def failure_event(exc: BaseException) -> Ev:
    """ETIMEDOUT: the kernel gave up on unacknowledged data (TCP_USER_TIMEOUT),
    a silent path like the one our own detector finds; anything else ended
    the connection."""
    return Ev.TIMEOUT if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT else Ev.SOCKET_ERROR


class PeerChannel(PeerTimers):
    def __init__(self, rank: int, env: PeerEnv) -> None:
        self.rank = rank
        self.env = env
        nrails = env.nrails
        self.outbound = SendChannel()
        self.inbound = RecvChannel()
        self.links: List[Optional[Link]] = [None] * nrails
        #: the escape policy of the pair (protocol/paths.py): link states, holds, the route
        self.paths = PeerPaths(env.rank, rank, nrails, env.policy, holddown=env.config.failback_holddown,
                               reconnect_max=env.config.reconnect_max, stranded_backoff=STRANDED_BACKOFF)
        self.sender = Sender(self)
        self.receiver = Receiver(rank, env, self.links, self.inbound, self.outbound, self.paths)
        #: what the peer advertised of its relay load (pairs it passes on)
        self.relay_load = 0
        self.closed_by_peer = False
        self.lost: Optional[BaseException] = None
        #: when links to this peer carried nonsense (ProtocolError), recently
        self.protocol_errors: List[float] = []
        #: the end-to-end MACs of our relayed frames, from both ranks' X25519 keys (protocol/relaymac.py)
        self.pairs = env.keys.pair(rank)
        #: relayed frames dropped without a verdict (a replay, or no public key of the peer)
        self.relayed_unknown = 0
        #: bytes moved by this peer's links that are closed now, per rail
        self.closed_sent: List[int] = [0] * nrails
        self.closed_received: List[int] = [0] * nrails
        #: a frame was applied: parked links may be able to go on (see ``_done``)
        self.resume_wanted = False
        self._out: list = []

    # ------------------------------------------------------------ the route (read-only: ``paths`` owns it)
    @property
    def status(self):
        return self.paths.status

    @property
    def active(self) -> List[int]:
        """Rails that carry our traffic now, best first (empty: no rail)."""
        return self.paths.active

    @property
    def relay(self) -> Optional["RelayPath"]:
        """The third rank our traffic goes through while no rail is left."""
        return self.paths.relay

    @property
    def no_path_since(self) -> Optional[float]:
        return self.paths.no_path_since

    @property
    def eof_since(self) -> Optional[float]:
        """When the last link ended with FIN/RST (a dead process, or a peer that dropped links it
        believed dead and will re-dial)."""
        return self.paths.eof_since

    @property
    def avoid(self) -> int:
        """Rails we hold out of service (grey failure), a bitmask."""
        return self.paths.avoid

    @property
    def peer_avoid(self) -> int:
        return self.paths.peer_avoid

    @property
    def peer_rails(self):
        return self.paths.peer_rails

    @property
    def holds(self):
        return self.paths.holds

    def _apply_paths(self) -> None:
        """Carry out what ``paths`` decided, in order."""
        for act in self.paths.take():
            kind = type(act)
            if kind is P.Emit:
                extra = act.extra
                if act.event == "no_path":
                    extra = dict(extra, since=self.env.clock.wall())
                self._out.append(Emit(act.event, act.rail, act.cause, extra))
            elif act is P.REPLAY:
                self.sender.replay = True
            elif kind is P.Fail:
                link = self.links[act.rail]  # (PeerPaths names only the pair's rails)
                if link is not None:
                    self.link_down(link, act.ev, detail=act.detail)
            elif kind is P.Control:
                link = self.links[act.rail]
                if link is not None:
                    self.sender.control(link, act.kind, arg=act.arg)
            elif act is P.REDIAL:
                self.report(Redial())
            elif act is P.NO_PATH:
                self.report(NoPath())
            elif act is P.PATH_BACK:
                self.report(PathBack())
            elif kind is P.RelayEnded:
                self.report(RelayEnded(act.route, act.why))
            elif act is P.RELAY_BEAT:
                self._beat()
            elif kind is P.Resend:
                log.info("rank %d via %d: nothing acknowledged for %.3fs with %d frames out: sending them again",
                         self.rank, self.relay.via, act.waited, act.frames)
            else:  # pragma: no cover - a new action without its shell
                raise TypeError(f"no shell for {act!r}")

    # ------------------------------------------------------------ outcomes
    def report(self, outcome) -> None:
        self._out.append(outcome)

    def _emit(self, event: str, rail: int, cause: Optional[str], **extra) -> None:
        self._out.append(Emit(event, rail, cause, extra))

    def _take_read(self) -> None:
        """Take what the receiver read, in order: outcomes are handed on, frames for the
        paths go to ``PeerPaths`` (``_heard``), a lost relayed frame is asked for again."""
        r = self.receiver
        if r.want_ack:
            r.want_ack = False
            self.sender.ack_urgent = True
        if r.want_resume:
            r.want_resume = False
            self.resume_wanted = True
        if not r.out:
            return
        got, r.out = r.out, []  # (what applying them makes the receiver read comes after, in order)
        for item in got:
            kind = type(item)
            if kind is Heard:
                self._heard(item.link, item.hdr)
            elif item is RESEND:
                self.lost_relayed()
            else:
                self._out.append(item)

    def _heard(self, link: Optional[Link], hdr: Header) -> None:
        """A frame for the paths (``link`` None: it came through a relay): its rail word (when it
        changed), then what a control frame says (not when its rail word took down the very link
        it came on)."""
        if hdr.rails != self.paths.peer_rails.word:
            self.on_peer_rails(hdr.rails)
            if link is not None and not link.open:
                return  # this very rail is down on the peer's side
        if hdr.kind != DATA and hdr.kind != RELAY:
            self.on_control(link, hdr)

    def _done(self):
        """End of a call from the engine: take what the receiver read, let parked links go on
        (never from inside a read loop), then hand over what happened."""
        self._take_read()
        guard = 0
        while self.resume_wanted and guard < 1000:
            self.resume_wanted = False
            guard += 1
            try:
                for link in self.receiver.resume_parked():
                    self.read_now(link)
            except ProtocolError as exc:
                self._protocol_error(None, exc)
            except LinkEscapeError as exc:
                self.report(Fatal(exc))
            self._take_read()
        out = self._out
        if not out:
            return NOTHING
        self._out = []
        return out

    # ------------------------------------------------------------ views
    def live_links(self) -> List[Link]:
        return [l for l in self.links if l is not None and self.status[l.rail].state is State.UP]

    def rail_bytes(self, rail: int) -> tuple:
        """(sent, received) on ``rail`` over every link ever opened to this peer."""
        link = self.links[rail]
        sent, received = self.closed_sent[rail], self.closed_received[rail]
        if link is not None:
            sent += link.bytes_sent
            received += link.bytes_received
        return sent, received

    @property
    def whole(self) -> bool:
        return all(st.state is State.UP for st in self.status)

    # ------------------------------------------------------------ data path (engine)
    def post_send(self, m) -> None:
        if not self.engaged():
            self._engaging(self.active)
        self.sender.post(m)

    def post_recv(self, m) -> None:
        if not self.engaged():
            self._engaging(())
        self.receiver.post(m)
        self._take_read()

    def take_any(self, m) -> bool:
        """An any-source receive being posted: this peer takes it if a whole unexpected message
        of its waits (its outcomes come with the next call's)."""
        taken = self.receiver.take_any(m)
        self._take_read()
        return taken

    def posted(self):
        """An operation with this peer was posted: frames that waited for its receives may go
        on (parked links, the stash), and what is ready is written."""
        if self.receiver.blocked():
            self.resume_wanted = True
        return self.pump()

    def _engaging(self, sending) -> None:
        """An operation's traffic starts: the links beat from now on (``tick``), the
        first a heartbeat interval after the link last sent, a calm rank's backups a
        ``CALM_BEAT`` after (``beat_every``; asked for a heartbeat interval after, each
        operation of a small job made a timer round of its own for a backup that was not
        due). The rails in ``sending`` are about to carry data: theirs is found by the
        next timer round."""
        env = self.env
        hb = env.config.heartbeat_interval
        calm = self.calm(env.clock.now(), False)
        beat_every = self.paths.beat_every
        for link in self.links:
            if link is not None and link.rail not in sending:
                env.soon(link.last_sent + beat_every(link.rail, True, hb, calm))

    def output_pending(self) -> bool:
        """Frames of ours to carve or replay (work for the background thread)."""
        sender = self.sender
        return bool(sender.queue or sender.replay)

    def wants_pump(self) -> bool:
        """Something to write now: frames ready to carve, or an acknowledgement the peer waits for."""
        sender = self.sender
        return sender.ready or (sender.ack_urgent and self.inbound.ack_owed)

    def undelivered(self) -> bool:
        """Messages of ours not carved yet, or frames the peer has not acknowledged."""
        return bool(self.sender.queue or self.outbound.unacked)

    def ack_at_once(self) -> None:
        """(closing) Every acknowledgement owed to the peer goes at once, not delayed."""
        self.sender.ack_urgent = True

    def pump(self):
        """Carve and write what is ready; an acknowledgement the peer waits for goes too."""
        sender = self.sender
        if sender.ready:
            sender.pump()
        if sender.ack_urgent and self.inbound.ack_owed:
            sender.send_ack()
        return self._done()

    def flush(self, link: Link):
        """Write what is queued on ``link`` (frames of others a relay queued there)."""
        if link.open and link.out:
            self.sender.flush(link)
        return self._done()

    def cancel(self, m) -> None:
        """A failed operation's message: unmatch it."""
        if m in self.sender.queue:
            self.sender.cancel(m)
        else:
            self.receiver.cancel(m)

    def materialize(self, lo: int, hi: int) -> int:
        return self.outbound.materialize(lo, hi)

    def zero_copy_pending(self, seq: int) -> bool:
        """Frames up to ``seq`` still point into caller memory, unacknowledged."""
        return self.outbound.acked < seq and self.outbound.zc > 0

    def needs(self, op) -> bool:
        """``op`` still needs something from this peer (its receives, its
        sends carved, or, for one that completes on delivery, acks)."""
        rank = self.rank
        return (any(m.peer == rank and not m.done for m in op.recvs)
                or any(m.peer == rank and m.carved < m.nbytes for m in op.sends)
                or (op.need_ack and op.last_seq.get(rank, 0) > self.outbound.acked))

    # ------------------------------------------------------------ links
    def open_link(self, link: Link, peer_expected: Optional[int] = None):
        """Put a link in service: one opened at start-up or by an emulated
        repair (``peer_expected`` None), or re-opened by either side (the
        peer's ``expected`` from its handshake: it has everything below)."""
        now = self.env.clock.now()
        rail = link.rail
        old = self.links[rail]
        reopened = peer_expected is not None
        if old is not None:
            if reopened:  # the peer re-dialed, so it considers the old connection dead
                self.link_down(old, Ev.SOCKET_ERROR, detail="replaced by a new connection")
            else:
                self._drop(old)
        self.links[rail] = link
        self.env.io.add_link(link)
        self.report(LinkUp(rail))
        link.grey = GreyDetector(self.env.rail_rates[rail])
        if reopened:
            out = self.outbound
            if out.acked < peer_expected - 1 <= out.last_seq:
                out.on_ack(peer_expected - 1)  # the peer has all below: replay less
        self.paths.opened(rail, link.epoch, now, reopened)
        if self.avoid:
            # tell the peer at once which rails we hold out (heartbeats repeat it)
            self._beat(link)
        self.paths.tell_stale(self.env.local_down)  # a path the peer can hear it on
        self._apply_paths()
        self.sender.pump()
        return self._done()

    def _drop(self, link: Link, close: bool = True) -> None:
        log.debug("drop link to rank %d rail %d (fd %d)", link.peer, link.rail, link.fd)
        self.env.io.remove_link(link)
        if self.links[link.rail] is link:
            self.links[link.rail] = None
            self.closed_sent[link.rail] += link.bytes_sent
            self.closed_received[link.rail] += link.bytes_received
        link.discard_queue()
        if close:
            link.close()
        else:
            link.open = False  # an emulated cut: silent, as a real one; closed when the rail returns
        self.report(LinkDown(link, severed=not close))

    def link_down(self, link: Link, ev: Ev, detail: str = "", close: bool = True) -> None:
        """A link failed: drop it and move its traffic (lossless: replay).
        ``close=False`` keeps the socket open but unused (an emulated cut must
        not send a FIN that a real cut never delivers)."""
        if not link.open or self.links[link.rail] is not link:
            return
        now = self.env.clock.now()
        self._drop(link, close=close)
        # A link parked on a frame ahead may have waited for this one.
        self.resume_wanted = True
        self.paths.failed(link.rail, ev, now, detail)  # (its state, the event, the new route, a re-dial)
        self._apply_paths()

    def link_failed(self, rail: int, ev: Ev, detail: str, close: bool = True):
        """(engine) The link on ``rail`` failed for a reason found outside it
        (our NIC lost carrier, an emulated fault)."""
        link = self.links[rail]
        if link is not None:
            self.link_down(link, ev, detail=detail, close=close)
        return self._done()

    def link_error(self, link: Link, exc: BaseException, what: str) -> None:
        self.link_down(link, failure_event(exc), detail=f"{what}: {exc}")

    def notify(self, kind: int, rail: int):
        """Tell the peer about our NIC on ``rail`` over another rail, if one is left."""
        self._notify(kind, rail)
        if kind == NOTIFY_UP:
            self.tell_stale()  # and, if we accept its links, what we dropped meanwhile
        return self._done()

    def _notify(self, kind: int, rail: int) -> None:
        links = [l for l in self.live_links() if l.rail != rail]
        if links:
            link = next((l for l in links if l.rail in self.active), links[0])
            self.sender.control(link, kind, arg=rail)

    def tell(self, kind: int, arg: int):
        """A control frame to the peer on its route (relayed if it is)."""
        self.sender.send_control(kind, arg)
        return self._done()

    def tell_all_links(self, kind: int, arg: int):
        """A control frame on every live link (PEER_LOST: it must get through)."""
        for link in self.live_links():
            self.sender.control(link, kind, arg=arg)
        if self.relay is not None:
            self.sender.send_control(kind, arg)
        return self._done()

    def resume(self):
        """Parked links may go on (a relay window opened)."""
        self.resume_wanted = True
        return self._done()

    def close_link(self, link: Link) -> None:
        """(closing) Out of service without a word."""
        self.env.io.remove_link(link)
        if self.links[link.rail] is link:
            self.links[link.rail] = None
        link.close()

    def read_now(self, link: Link) -> None:
        """A parked link's frame was bound: go on reading what it holds."""
        if not len(link.sink) or link.buffered:
            self._read(link)
        # otherwise reading resumes through poll

    # ------------------------------------------------------------ relay (the engine chooses the path)
    def use_relay(self, path: "RelayPath"):
        """No rail is left: try ``path`` (a third rank). Frames go through it
        at once; it counts as our path (``relay_on``) from the first frame
        of the peer's that comes back through a relay, so a rank that
        cannot reach the peer (it says so: RELAY_UNREACH) or a peer that is
        gone never looks relayed."""
        self.paths.relay_started(path, self.env.clock.now())
        self._apply_paths()
        self.sender.pump()
        self._beat()
        return self._done()

    def relay_lost(self, via: int, why: str):
        """The relay through ``via`` cannot carry our frames any more (it
        lost its path to us or to the peer, or said so)."""
        self._relay_lost(via, why)
        return self._done()

    def _relay_lost(self, via: int, why: str) -> None:
        if self.paths.relay_lost(via, why, self.env.clock.now()):
            self._apply_paths()
            self.sender.pump()

    def replay_now(self):
        """Frames on their way to the peer were lost (a relay said so): send again."""
        self.sender.replay = True
        self.sender.pump()
        return self._done()

    def lost_relayed(self) -> None:
        """A frame could not be kept (a relayed one, or one ahead of a gap no link of ours can
        fill): ask the peer to send again everything we have not acknowledged."""
        self.sender.send_control(RELAY_RESET, arg=self.env.rank)

    # ------------------------------------------------------------ poll events
    def on_event(self, link: Link, ev: int):
        if not link.open:
            return NOTHING
        if link.parked and ev & POLLERR:
            # A parked link is not read, so an error would go unseen.
            import os
            import socket as _socket

            err = link.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
            self._on_disconnect(link, ConnectionResetError(
                err, f"error on a parked link: poll {ev:#x}, {os.strerror(err) if err else 'no error'}"))
            return self._done()
        if ev & POLLIN or (ev & POLLERR and not ev & POLLOUT):
            self._read(link)
        if link.open:
            if ev & POLLOUT:
                self.sender.flush(link)
            elif ev & POLLERR:
                self._on_disconnect(link, ConnectionResetError("POLLERR/POLLHUP"))
        if self.sender.ready:
            self.sender.pump()
        return self._done()

    def _read(self, link: Link) -> None:
        """Read ``link`` on; what the receiver read is taken after each of its loops (a frame for
        the paths ends one: the next goes on only if the link is still open and not parked)."""
        try:
            more = True
            while more:
                try:
                    more = self.receiver.on_readable(link)
                finally:
                    self._take_read()
                more = more and link.open and not link.parked
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as exc:
            self._protocol_error(link, exc)
        except LinkEscapeError as exc:  # the ranks disagree (CollectiveMismatch): the job is wrong
            self.report(Fatal(exc))
            # stop reading this link: its frame has nowhere to go (a hang-up still shows)
            link.reset_read()
            link.parked = True
            self.env.io.want(link, POLLOUT if link.out else 0)
        except Exception as exc:  # OSError, LinkClosed
            if is_disconnect(exc):
                self._on_disconnect(link, exc)
            else:
                raise

    def _protocol_error(self, link: Optional[Link], exc: ProtocolError, count: bool = True) -> None:
        """The link carried nonsense: it is a failed link (closed, replayed
        elsewhere, re-dialed). Only a peer that keeps sending nonsense on fresh
        links fails the communicator (``count`` False: not toward that)."""
        now = self.env.clock.now()
        log.warning("rank %d rail %s: %s", self.rank, link.rail if link is not None else "relay", exc)
        if isinstance(exc, FrameAuthError) or not count:  # the path's doing: it costs the link only
            if link is not None:
                self.link_down(link, Ev.PROTOCOL_ERROR, detail=str(exc))
            return
        self.protocol_errors = [t for t in self.protocol_errors if now - t < PROTOCOL_ERROR_WINDOW] + [now]
        if link is not None:
            self.link_down(link, Ev.PROTOCOL_ERROR, detail=str(exc))
        elif self.relay is not None:
            self._relay_lost(self.relay.via, "protocol_error")
        if len(self.protocol_errors) >= PROTOCOL_ERROR_LIMIT:
            self.report(Fatal(ProtocolError(
                f"rank {self.rank} sent frames that break the protocol on {len(self.protocol_errors)} links "
                f"within {PROTOCOL_ERROR_WINDOW:g}s (last: {exc})", peer=self.rank,
                rail=link.rail if link is not None else None)))

    def _on_disconnect(self, link: Link, exc: BaseException) -> None:
        if self.closed_by_peer:
            self._drop(link)
            return
        self.link_down(link, failure_event(exc), detail=f"{type(exc).__name__}: {exc}")
        # Every link ended with FIN/RST. A dead process also lost its listener:
        # the dialing side learns that at once (connection refused on every
        # rail); the accepting side waits briefly for a re-dial, which a live
        # peer that merely dropped a link it believed dead would make.
        if not self.live_links() and self.lost is None and self.eof_since is None:
            self.paths.ended(self.env.clock.now())
            self._apply_paths()

    def bad_relayed(self, link: Optional[Link], exc: ProtocolError):
        """(the relay's channel) A frame this peer passed on to us, claiming another rank as its
        source, breaks the protocol: it costs this peer's link it came on, that link only (as a
        ``FrameAuthError``): never toward the limit of protocol errors that fails the job (the
        frame may be a third rank's doing, or an on-path attacker's)."""
        self._protocol_error(link, exc, count=False)
        return self._done()

    def relay_broke(self, via: int):
        """A frame of this peer's that ``via`` passed on broke the protocol (counted against
        ``via``'s link): our route to this peer through ``via`` is left."""
        if self.relay is not None and self.relay.via == via:
            self._relay_lost(via, "protocol_error")
        return self._done()

    def on_relayed(self, frame: memoryview):
        """A frame of this peer that a third rank passed on to us. A ``ProtocolError`` is the
        relay's (``bad_relayed``): raised to the caller, never counted against this peer."""
        try:
            try:
                frame = self.pairs.open(frame)  # its end-to-end MAC: the relay cannot forge it
            except Unknown:  # a replay, or a peer whose public key we never read: no verdict
                self.relayed_unknown += 1
                return self._done()
            hdr = unpack_header(frame, self.env.config.max_frame_bytes)
            if len(frame) != HEADER_SIZE + hdr.length:
                raise ProtocolError(f"relayed frame of {len(frame)} bytes announces {hdr.length}", peer=self.rank)
            if hdr.kind == RELAY:
                raise ProtocolError("a relayed frame relays another", peer=self.rank)
            self.paths.relay_heard(self.env.clock.now())
            self._apply_paths()
            if hdr.ack:
                self.outbound.on_ack(hdr.ack)
            self._heard(None, hdr)  # its rail word; what a control frame says
            if hdr.kind == DATA:
                try:
                    self.receiver.on_relayed(frame)
                finally:
                    self._take_read()
        except ProtocolError:
            raise
        except LinkEscapeError as exc:
            self.report(Fatal(exc))
        if self.sender.queue or self.sender.replay or self.sender.ack_urgent:
            self.sender.pump()
        return self._done()

    def on_control(self, link: Optional[Link], hdr: Header) -> None:
        kind = hdr.kind
        arg = hdr.arg
        if kind == HEARTBEAT:
            if link is not None:
                # the sender's silence check waits for our kernel's ack of it: not a delayed one
                ack_now(link.sock)
            self.relay_load = arg >> LOAD_SHIFT
            if self.paths.peer_held(arg, self.env.clock.now()):  # (it reads the avoid bits)
                self.env.soon(0.0)  # a rail held out: the timers keep a close eye on the peer
                self._apply_paths()
                self.sender.pump()
        elif kind == BYE:
            # The peer drained before saying BYE: whatever we still wait for
            # from it will never come.
            self.closed_by_peer = True
            self.lost = PeerLost(f"rank {self.rank} closed its communicator", peer=self.rank)
            self.report(Closed(self.lost))
        elif kind in (NOTIFY_DOWN, NOTIFY_SILENT, NOTIFY_UP, NOTIFY_STALE):
            self.paths.notice(kind, arg, self.env.clock.now())
            self._apply_paths()
        elif kind == PEER_LOST:
            self.report(LostReported(arg))
        elif kind == RELAY_UNREACH:
            self.report(Unreachable(arg))
        elif kind == RELAY_RESET:
            if arg == self.rank:
                self.sender.replay = True  # the peer itself lost relayed frames
            else:
                self.report(RelayReset(arg))

    def tell_stale(self) -> None:
        """Where we dropped a link the peer may still hold, tell it over a live link
        (``PeerPaths.tell_stale``: level state, nothing periodic)."""
        self.paths.tell_stale(self.env.local_down)
        self._apply_paths()

    @property
    def stranded(self) -> bool:
        """No rail carries our traffic and no relay does (re-dials go at STRANDED_CONNECT's pace)."""
        paths = self.paths
        return paths.no_path_since is not None and paths.relay is None and self.lost is None

    def rail_back(self, rail: int) -> bool:
        """(engine) Our NIC on ``rail`` is back: dial its link again now if it is down."""
        back = self.paths.retry_now(rail, self.env.clock.now())
        self.paths.take()  # (the engine wakes Recovery itself)
        return back

    def on_peer_rails(self, word: int) -> None:
        """The peer's rails without carrier, as every frame repeats them."""
        self.paths.peer_word(word, self.env.clock.now(), self.env.local_down)
        self._apply_paths()

    # ------------------------------------------------------------ state for operators
    def waiting_note(self, now: float) -> str:
        """(a timed-out operation's message) What this rank knows of its path to the peer: the
        route, the links up, when a frame of the peer's was last read, what of ours it has not
        acknowledged."""
        up = [l.rail for l in self.live_links()]
        if self.relay is not None:
            route = f"through rank {self.relay.via}"
        elif self.active:
            route = f"on rail {self.active[0]}"
        elif self.no_path_since is not None:
            route = f"no path for {now - self.no_path_since:.1f}s"
        else:
            route = "no link opened yet"
        heard = self.receiver.heard
        read = f"last read {now - heard:.1f}s ago" if heard else "nothing read yet"
        out = self.outbound
        return (f"rank {self.rank}: {route}, links up on rails {up}, {read}, "
                f"{out.last_seq - out.acked} of our frames unacknowledged")

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
        relay = self.relay
        return {
            "peer": self.rank,
            "primary": self.active[0] if self.active else None,
            "active": list(self.active),
            "via": relay.via if relay is not None else None,
            "relay_bytes": relay.bytes if relay is not None else 0,
            "sent": self.outbound.last_seq,
            "acked": self.outbound.acked,
            "received": self.inbound.cumulative_ack,
            "unacked_bytes": self.outbound.unacked_bytes,
            "replayed_bytes": self.sender.replayed_bytes,
            "no_path_s": None if self.no_path_since is None else now - self.no_path_since,
            "lost": None if self.lost is None else f"{type(self.lost).__name__}: {self.lost}",
            "links": links,
        }
