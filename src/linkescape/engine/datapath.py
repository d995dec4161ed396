"""The data path of the engine: frames out of posted sends, frames into
posted receives, in order and exactly once, and the memory rules that make
replay safe. A mixin of ``Engine``; every method runs under its lock."""

from __future__ import annotations

import collections
import select
import time
from typing import Optional

from ..errors import CollectiveMismatch, LinkEscapeError, PeerLost, ProtocolError
from ..protocol.channel import AHEAD, DUPLICATE, address_range
from ..protocol.frames import FLAG_ACK_NOW, P2P_FLAG, Header, Kind, pack_header
from ..protocol.linkstate import Ev, State
from .link import Link, WireItem, is_disconnect
from .messages import InMessage
from .peer import Peer, Unexpected

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT


class DataPath:
    def _post_p2p_recv(self, peer: Peer, m: InMessage) -> None:
        tag = m.msg
        queue = peer.unexpected.get(tag)
        if queue and queue[0].done:
            self._take_unexpected(peer, queue.popleft(), m)
            return
        peer.p2p_recvs.setdefault(tag, collections.deque()).append(m)

    def _take_unexpected(self, peer: Peer, u: Unexpected, m: InMessage) -> None:
        if u.nbytes != m.nbytes:
            self._fail_op(m.op, CollectiveMismatch(
                f"recv of {m.nbytes} bytes from rank {peer.rank} matched a send of {u.nbytes} bytes",
                peer=peer.rank, op_seq=m.op.seq))
            return
        if m.nbytes:
            self._protect_range(m.dst)
            m.dst[:] = u.buf
        m.received = m.nbytes
        self._recv_done(peer, m)

    def _pump(self, peer: Peer) -> None:
        if not peer.active:
            return
        links = [peer.links[r] for r in peer.active]
        links = [l for l in links if l is not None]
        if not links:
            return
        if peer.replay:
            peer.replay = False
            ack = peer.recv.cumulative_ack
            for i, frame in enumerate(peer.send.unacked):
                link = links[i % len(links)]
                link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, frame.msg, frame.offset, frame.length,
                                                frame.sig, arg=frame.arg, flags=frame.flags), frame))
            peer.recv.ack_sent_upto(ack)
        sendq = peer.sendq
        chunk = self.config.chunk_bytes
        copy_bytes = self.config.copy_bytes
        schan = peer.send
        while sendq:
            m = sendq[0]
            if m.carved >= m.ready and m.nbytes:
                break
            if len(links) == 1:
                link = links[0]
            else:
                link = min(links, key=lambda l: l.out_bytes)
            if link.out_bytes >= self.watermark:
                break
            n = min(chunk, m.ready - m.carved)
            off = m.carved
            copy = n <= copy_bytes
            frame = schan.emit(m.msg, m.sig, off, m.view[off:off + n], copy=copy)
            frame.arg = m.nbytes
            op = m.op
            op.last_seq[peer.rank] = frame.seq
            flags = 0 if copy and not op.need_ack else FLAG_ACK_NOW
            frame.flags = flags
            ack = peer.recv.cumulative_ack
            link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, m.msg, off, n, m.sig, arg=m.nbytes,
                                            flags=flags), frame))
            peer.recv.ack_sent_upto(ack)
            m.carved += n
            if m.carved == m.nbytes:
                sendq.popleft()
        for link in links:
            if link.out:
                self._flush(link)

    def _flush(self, link: Link) -> None:
        try:
            emptied = link.flush()
        except OSError as exc:
            self.link_down(link, Ev.SOCKET_ERROR, detail=f"send: {exc}")
            return
        link.last_sent = time.monotonic()
        want = POLLIN if emptied else POLLIN | POLLOUT
        if link.parked:
            want &= ~POLLIN
        if self.masks.get(link.fd) != want:
            self.masks[link.fd] = want
            self.poller.modify(link.fd, want)

    def _set_reading(self, link: Link, reading: bool) -> None:
        want = (POLLIN if reading else 0) | (POLLOUT if link.out else 0)
        if self.masks.get(link.fd) != want:
            self.masks[link.fd] = want
            self.poller.modify(link.fd, want)

    def _on_readable(self, link: Link) -> None:
        peer = self.peers[link.peer]
        if link.parked:
            return  # waiting for an earlier frame or a posted receive
        try:
            while True:
                if link.hdr is None:
                    hdr = link.read_header()
                    if hdr is None:
                        continue
                    if hdr.ack:
                        peer.send.on_ack(hdr.ack)
                    if hdr.kind != Kind.DATA:
                        self._on_control(peer, link, hdr)
                        if link.status.state is not State.UP:
                            return
                        continue
                    link.hdr = hdr
                    if not self._bind(peer, link):
                        return
                if link.sink_got < len(link.sink):
                    if not link.read_payload():
                        continue
                self._deliver(peer, link)
        except (BlockingIOError, InterruptedError):
            return
        except LinkEscapeError as exc:
            self._set_fatal(exc)
        except OSError as exc:
            if is_disconnect(exc):
                self._on_disconnect(peer, link, exc)
            else:
                raise
        except Exception as exc:  # LinkClosed
            if is_disconnect(exc):
                self._on_disconnect(peer, link, exc)
            else:
                raise

    def _on_disconnect(self, peer: Peer, link: Link, exc: BaseException) -> None:
        if peer.closed_by_peer:
            self._drop_link(link)
            return
        self.link_down(link, Ev.SOCKET_ERROR, detail=f"{type(exc).__name__}: {exc}")
        # Every link ended with FIN/RST. A dead process also lost its listener:
        # the dialing side learns that at once (connection refused on every
        # rail); the accepting side waits briefly for a re-dial, which a live
        # peer that merely dropped a link it believed dead would make.
        if not peer.live_links() and peer.lost is None and peer.eof_since is None:
            peer.eof_since = time.monotonic()
            if self.rank > peer.rank:
                for st in peer.status:
                    if st.state is State.DOWN:
                        st.next_probe = time.monotonic()
                if self.on_redial is not None:
                    self.on_redial()

    def _on_control(self, peer: Peer, link: Link, hdr: Header) -> None:
        if hdr.kind == Kind.BYE:
            # The peer drained before saying BYE: whatever we still wait for
            # from it will never come.
            peer.closed_by_peer = True
            peer.lost = PeerLost(f"rank {peer.rank} closed its communicator", peer=peer.rank)
            self._fail_ops_needing(peer, peer.lost)
        elif hdr.kind == Kind.NOTIFY_DOWN:
            other = peer.links[hdr.arg] if hdr.arg < len(peer.links) else None
            peer.peer_carrier_down[hdr.arg] = True
            if other is not None:
                self.link_down(other, Ev.PEER_CARRIER_DOWN, detail="peer NIC lost carrier")
        elif hdr.kind == Kind.NOTIFY_SILENT:
            other = peer.links[hdr.arg] if hdr.arg < len(peer.links) else None
            if other is not None:
                self.link_down(other, Ev.TIMEOUT, detail="the peer found the link silent")
        elif hdr.kind == Kind.NOTIFY_UP:
            peer.peer_carrier_down[hdr.arg] = False
            if hdr.arg < len(peer.status) and peer.status[hdr.arg].state is State.DOWN:
                peer.status[hdr.arg].next_probe = time.monotonic()
                peer.status[hdr.arg].backoff = 0.0
                if self.on_redial is not None:
                    self.on_redial()

    def _bind(self, peer: Peer, link: Link) -> bool:
        """Decide where the current frame's payload goes; False to park."""
        hdr = link.hdr
        cls = peer.recv.classify(hdr.seq)
        if cls is DUPLICATE:
            # a replay of something we have: our ack may have died with a link
            link.binding = None
            link.sink = self._discard(hdr.length)
            peer.recv.ack_sent = 0
            peer.ack_urgent = True
        elif cls is AHEAD:
            if any(other is not link and other.status.state is State.UP for other in peer.links if other):
                return self._park(link)  # the gap is on its way over another link
            # No other link can fill the gap: the frames missing are replayed
            # behind this one on this very link, and so is this one. Drop it.
            link.binding = None
            link.sink = self._discard(hdr.length)
        else:
            cur = peer.cur_in
            if cur is None:
                cur = self._match(peer, hdr)
                if cur is None:
                    return self._park(link)
                peer.cur_in = cur
            elif cur.msg != hdr.msg or cur.received != hdr.offset:
                raise ProtocolError(f"frame of message {hdr.msg:#x} at offset {hdr.offset} while "
                                    f"{cur.msg:#x} is at {cur.received}", peer=peer.rank, rail=link.rail)
            if hdr.offset + hdr.length > cur.nbytes:
                raise CollectiveMismatch(
                    f"rank {peer.rank} sent {hdr.offset + hdr.length} bytes where {cur.nbytes} were expected",
                    peer=peer.rank, op_seq=hdr.msg)
            link.binding = cur
            if isinstance(cur, Unexpected):
                link.sink = cur.buf[hdr.offset:hdr.offset + hdr.length]
            elif cur.reduce is not None:
                link.sink = link.staging_view(hdr.length)
            else:
                sink = cur.dst[hdr.offset:hdr.offset + hdr.length]
                self._protect_range(sink)
                link.sink = sink
        if link.parked:
            link.parked = False
            self._set_reading(link, True)
        link.sink_got = 0
        return True

    def _park(self, link: Link) -> bool:
        if not link.parked:
            link.parked = True
            self._set_reading(link, False)
        return False

    def _match(self, peer: Peer, hdr: Header):
        if hdr.offset != 0:
            raise ProtocolError(f"message {hdr.msg:#x} starts at offset {hdr.offset}", peer=peer.rank)
        if hdr.msg & P2P_FLAG:
            queue = peer.p2p_recvs.get(hdr.msg)
            if queue:
                m = queue.popleft()
                if m.nbytes != hdr.arg:
                    raise CollectiveMismatch(
                        f"recv of {m.nbytes} bytes from rank {peer.rank} matched a send of {hdr.arg} bytes",
                        peer=peer.rank, op_seq=m.op.seq)
                return m
            u = Unexpected(hdr.msg, hdr.sig, hdr.arg)
            peer.unexpected.setdefault(hdr.msg, collections.deque()).append(u)
            return u
        if not peer.coll_recvs or peer.coll_recvs[0].msg > hdr.msg:
            if hdr.msg <= self.coll_started:
                raise CollectiveMismatch(
                    f"rank {peer.rank} sent data for collective #{hdr.msg}, in which rank {self.rank} expects "
                    f"nothing from it (different operation, root or group)", peer=peer.rank, op_seq=hdr.msg)
            return None
        m = peer.coll_recvs[0]
        if m.msg != hdr.msg or m.sig != hdr.sig or m.nbytes != hdr.arg:
            raise CollectiveMismatch(_mismatch_text(self.rank, peer.rank, m, hdr), peer=peer.rank, op_seq=m.op.seq)
        peer.coll_recvs.popleft()
        return m

    def _discard(self, n: int) -> memoryview:
        if len(self.scratch) < n:
            self.scratch = memoryview(bytearray(n))
        return self.scratch[:n]

    def _deliver(self, peer: Peer, link: Link) -> None:
        hdr = link.hdr
        m = link.binding
        if m is not None and hdr.seq != peer.recv.expected:
            m = None  # another link delivered this frame first: a duplicate now
        if m is not None:
            peer.recv.applied(hdr.seq)
            if hdr.flags & FLAG_ACK_NOW:
                peer.ack_urgent = True  # the sender waits for it
            if isinstance(m, Unexpected):
                m.received += hdr.length
                if m.received == m.nbytes:
                    m.done = True
                    peer.cur_in = None
                    queue = peer.p2p_recvs.get(m.msg)
                    if queue:
                        peer.unexpected[m.msg].remove(m)
                        self._take_unexpected(peer, m, queue.popleft())
            else:
                if m.reduce is not None and hdr.length:
                    m.reduce(hdr.offset, link.sink)
                m.received += hdr.length
                if m.on_frame is not None:
                    m.on_frame(m.received)
                if m.received == m.nbytes:
                    peer.cur_in = None
                    self._recv_done(peer, m)
            # A copy of this frame half-read on another (failing) link must
            # never land in memory that may be reused from now on.
            for other in peer.links:
                if (other is not None and other is not link and other.binding is not None
                        and other.hdr is not None and other.hdr.seq < peer.recv.expected):
                    other.binding = None
                    other.sink = self._discard(len(other.sink))
        link.reset_read()
        # A parked link may hold the next frame: the one that was ahead of
        # this one (failback: new frames on the primary while the backup
        # drains), or the start of a message that is posted now.
        self._resume_parked(peer, skip=link)

    def _recv_done(self, peer: Peer, m: InMessage) -> None:
        m.done = True
        op = m.op
        op.pending_recvs -= 1
        if op.pending_recvs == 0:
            self._check_op(op, time.monotonic())

    def _resume_parked(self, peer: Peer, skip: Optional[Link] = None) -> None:
        for link in peer.links:
            if link is not None and link.parked and link is not skip and link.hdr is not None:
                try:
                    if self._bind(peer, link) and not len(link.sink):
                        self._deliver(peer, link)  # nothing to read: no poll event would come
                    # otherwise reading resumes through poll
                except LinkEscapeError as exc:
                    self._set_fatal(exc)

    def _protect_range(self, view: memoryview) -> None:
        """Before caller memory is overwritten, turn zero-copy frames that
        point into it into copies, so a replay sends the original bytes."""
        lo = None
        for peer in self.peers.values():
            if peer.send.zc:
                if lo is None:
                    if not len(view):
                        return
                    lo, hi = address_range(view)
                peer.send.materialize(lo, hi)


def _mismatch_text(rank: int, peer: int, m: InMessage, hdr: Header) -> str:
    if m.msg != hdr.msg:
        return (f"rank {peer} is at collective #{hdr.msg} while rank {rank} is at #{m.msg}: "
                f"the ranks called a different number or sequence of collectives")
    if m.sig != hdr.sig:
        return (f"collective #{m.msg} differs between rank {rank} and rank {peer} "
                f"(operation, dtype, reduce op, root or shape: signature {m.sig:#010x} vs {hdr.sig:#010x})")
    return f"collective #{m.msg}: rank {peer} sends {hdr.arg} bytes where rank {rank} expects {m.nbytes}"
