"""Driving the engine: the progress round, timers (heartbeats, silent-loss
detection, deadlines), the caller-driven wait, the background thread, and a
graceful close. A mixin of ``Engine``."""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Callable, Optional

from ..errors import CommClosed, CommTimeout, LinkEscapeError, LinkFailure
from ..protocol.frames import Kind
from ..protocol.linkstate import Ev, State
from ..transport.tcp import ack_silence, tcp_info_summary
from .messages import Op
from .peer import Peer

log = logging.getLogger("linkescape.engine")

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


class Loop:
    def _acquire(self) -> None:
        if not self.lock.acquire(blocking=False):
            with self._drivers_cv:  # the count is shared between threads
                self._waiters += 1
            try:
                self.wake()  # whoever holds it may sit in poll(): make it let go
                self.lock.acquire()
            finally:
                with self._drivers_cv:
                    self._waiters -= 1

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the lock in the next progress round, from any
        thread, without waiting for the lock (the driver may hold it for long)."""
        self._soon.append(fn)
        self.wake()

    def _run_soon(self) -> None:
        soon = self._soon
        while soon:
            fn = soon.popleft()
            try:
                fn()
            except LinkEscapeError as exc:
                self._set_fatal(exc)

    def start(self, op: Op) -> None:
        """Hand an asynchronous op (messages attached) to the engine; the
        background thread drives it until someone waits."""
        self._acquire()
        try:
            self._start_locked(op)
        finally:
            self.lock.release()
        self.wake()

    def run(self, op: Op, posted=None) -> None:
        """Start ``op`` and drive it to completion from the calling thread;
        ``posted`` (a held lock) is released once the op is in the engine."""
        with self._drivers_cv:
            self._drivers += 1
        try:
            self._acquire()
            try:
                try:
                    self._start_locked(op)
                finally:
                    if posted is not None:
                        posted.release()
                self._drive_locked(op, None)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

    def progress_once(self, timeout: float) -> None:
        """One round: poll, read, write, timers. Caller holds the lock."""
        try:
            events = self.poller.poll(max(0.0, timeout) * 1000.0)
        except InterruptedError:
            events = []
        if self._soon:
            self._run_soon()
        by_fd = self.by_fd
        for fd, ev in events:
            link = by_fd.get(fd)
            if link is None:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                elif fd in self.extra_fds:
                    self.extra_fds[fd](ev)
                continue
            if link.parked and ev & POLLERR:
                # A parked link is not read, so an error would go unseen.
                import socket as _socket

                err = link.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
                self._on_disconnect(self.peers[link.peer], link, ConnectionResetError(
                    err, f"error on a parked link: poll {ev:#x}, {os.strerror(err) if err else 'no error'}"))
                continue
            if ev & POLLIN or (ev & POLLERR and not ev & POLLOUT):
                self._on_readable(link)
                if by_fd.get(fd) is not link:
                    continue
            if ev & POLLOUT:
                self._flush(link)
            elif ev & POLLERR and by_fd.get(fd) is link:
                self._on_disconnect(self.peers[link.peer], link, ConnectionResetError("POLLERR/POLLHUP"))
        now = time.monotonic()
        for peer in self.peers.values():
            if peer.sendq or peer.replay:
                self._pump(peer)
            if peer.ack_urgent and peer.recv.ack_owed:
                self._send_ack(peer)
        if self.ops:
            for op in list(self.ops):
                if not op.done:
                    self._check_op(op, now)
                if not op.done and now > op.deadline:
                    self._timeout_op(op, now)
        if now >= self._next_timer:
            self._next_timer = now + min(0.01, self.config.heartbeat_interval / 2)
            self._timers(now)

    def _send_ack(self, peer: Peer) -> None:
        links = [peer.links[r] for r in peer.active if peer.links[r] is not None]
        if not links:
            return
        link = links[0]
        peer.ack_urgent = False
        ack = peer.recv.cumulative_ack
        link.queue_control(Kind.ACK, ack)
        peer.recv.ack_sent_upto(ack)
        self._flush(link)

    def _timers(self, now: float) -> None:
        hb = self.config.heartbeat_interval
        # If this rank was not running (descheduled, stopped, a long GIL hold),
        # nothing was observed meanwhile: start watching afresh.
        blind = now - self._last_timers > self.config.silent_timeout / 2
        self._last_timers = now
        for peer in self.peers.values():
            for link in peer.links:
                if link is None or link.status.state is not State.UP:
                    continue
                if self._silent(link, now, blind):
                    self.link_down(link, Ev.TIMEOUT, detail=f"no acknowledgement for "
                                                            f"{now - link.pending_since:.3f}s "
                                                            f"({tcp_info_summary(link.sock)})")
                    # the other end would find out only at its own next check
                    self.notify(peer, Kind.NOTIFY_SILENT, link.rail)
                    continue
                if now - link.last_sent >= hb and not link.out:
                    link.queue_control(Kind.HEARTBEAT, peer.recv.cumulative_ack)
                    peer.recv.ack_sent_upto(peer.recv.cumulative_ack)
                    self._flush(link)
            if peer.no_path_since is not None and peer.lost is None:
                if peer.eof_since is not None and now - peer.eof_since > self.config.peer_lost_timeout * 0.75:
                    self._peer_lost(peer, f"rank {peer.rank} closed every link and did not come back")
                elif now - peer.no_path_since > self.config.no_path_timeout:
                    self._no_path_expired(peer, now)
                elif self._silent_everywhere(peer):
                    # A host that lost every rail looks the same from here as
                    # one that died; the isolated rank says so through the
                    # store (the management network), which settles it.
                    isolated = self.isolated.get(peer.rank)
                    if isolated is None and self.on_suspect is not None:
                        self.on_suspect(peer.rank)
                    waited = now - max(st.since for st in peer.status)
                    if isolated is False or (isolated is None and waited > self.config.peer_lost_timeout * 0.75):
                        self._peer_lost(peer, f"rank {peer.rank} stopped answering on every rail at once",
                                        "timeout")
            elif peer.active:
                best = self.policy.choose(peer.status, now)
                if best != peer.active:
                    self._reroute(peer, now)
                    self._pump(peer)
            if peer.recv.ack_owed:
                self._send_ack(peer)
        for tick in self.tickers:
            tick(now)

    def _silent(self, link, now: float, blind: bool) -> bool:
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
        if silent is None or blind:
            link.pending_since = None if silent is None else now
            return False
        if link.pending_since is None:
            link.pending_since = now
        return min(silent, now - link.pending_since) > self.config.silent_timeout

    def _silent_everywhere(self, peer: Peer) -> bool:
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
        return max(times) - min(times) <= self.config.peer_lost_timeout

    def _no_path_expired(self, peer: Peer, now: float) -> None:
        since = time.time() - (now - peer.no_path_since)
        err = LinkFailure(f"no path to rank {peer.rank} on any rail {list(range(self.nrails))} since "
                          f"{time.strftime('%H:%M:%S', time.localtime(since))}", peer=peer.rank,
                          rails=list(range(self.nrails)), since=since)
        peer.lost = err
        self._fail_ops_needing(peer, err)

    def _timeout_op(self, op: Op, now: float) -> None:
        waiting = sorted({m.peer for m in op.recvs if not m.done} |
                         {m.peer for m in op.sends if m.carved < m.nbytes})
        self._fail_op(op, CommTimeout(f"{op.name} (op {op.seq}) timed out waiting for ranks {waiting}",
                                      peers=waiting, op_seq=op.seq))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def wait(self, op: Op, timeout: Optional[float] = None) -> bool:
        """Drive progress until ``op`` is done; False on timeout."""
        if op.done:
            return True
        with self._drivers_cv:
            self._drivers += 1
        try:
            self._acquire()
            try:
                return self._drive_locked(op, None if timeout is None else time.monotonic() + timeout)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

    def _drive_locked(self, op: Op, end: Optional[float]) -> bool:
        while not op.done:
            if self._waiters:
                # Another thread wants the lock (to post, or to wait on its own
                # op): let it in between two rounds, then make progress anyway.
                self.lock.release()
                time.sleep(0.0002)
                self.lock.acquire()
            now = time.monotonic()
            left = 0.05 if end is None else min(0.05, end - now)
            if left <= 0:
                return False
            if op.settle_until is not None:
                left = min(left, max(0.0, op.settle_until - now))
            left = min(left, max(0.0, self._next_timer - now))
            if self.spin:
                # Poll without sleeping for a few microseconds first: a reply
                # usually comes within a round trip, and waking up from a
                # blocking poll costs more than that. Only when this rank has
                # a core to itself (see Communicator).
                spin_end = now + self.spin
                while not op.done and time.monotonic() < spin_end:
                    self.progress_once(0.0)
                if op.done:
                    break
            self.progress_once(left)
        return True

    def _driver_done(self) -> None:
        with self._drivers_cv:
            self._drivers -= 1
            if not self._drivers and self._async_work():
                self._drivers_cv.notify_all()  # hand async work back to the progress thread
        if not self._drivers and self._async_work():
            self.wake()

    def _async_work(self) -> bool:
        return bool(self.ops) or any(p.sendq or p.replay for p in self.peers.values())

    def start_background(self) -> None:
        self._thread = threading.Thread(target=self._background, name=f"linkescape-progress-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def _background(self) -> None:
        """Drive async operations while nobody waits; otherwise tick timers.

        While a caller drives, this thread stays off the lock and off the
        links, so frames wake exactly one thread."""
        while not self.closed:
            if self._drivers:
                # A caller drives (and runs the timers): stay out of its way.
                with self._drivers_cv:
                    if self._drivers and not self.closed:
                        self._drivers_cv.wait(0.1)
                continue
            if not self._async_work():
                try:
                    ready = self.idle_poller.poll(max(0.0, self._next_timer - time.monotonic()) * 1000.0)
                except (InterruptedError, RuntimeError):
                    ready = []
                for fd, _ in ready:
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except OSError:
                            pass
                if self._drivers or self.closed:
                    continue
                if self.lock.acquire(blocking=False):
                    try:
                        if not self.closed and not self._drivers:
                            self.progress_once(0.0)
                    except Exception as exc:  # noqa: BLE001
                        log.exception("progress failed")
                        self._set_fatal(exc)
                    finally:
                        self.lock.release()
                continue
            if not self.lock.acquire(timeout=0.05):
                continue
            try:
                if not self.closed and not self._drivers:
                    self.progress_once(min(0.01, max(0.0, self._next_timer - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - never die silently: fail the ops instead
                log.exception("progress failed")
                self._set_fatal(exc)
            finally:
                self.lock.release()

    def close(self, graceful: bool = True, drain: float = 10.0) -> None:
        """Graceful: deliver everything still unacknowledged, say BYE on every
        link, half-close and wait for the peer's EOF, so no RST can destroy
        bytes the peer has not read yet."""
        self._acquire()
        try:
            if self.closed:
                return
            if graceful and self.fatal is None:
                self._drain(time.monotonic() + drain)
                self._goodbye(time.monotonic() + 2.0)
            self.closed = True
            for peer in self.peers.values():
                for link in peer.links:
                    if link is not None:
                        self._drop_link(link)
            for link in self.severed:
                link.close()
            for op in list(self.ops):
                self._fail_op(op, CommClosed("communicator closed while the operation was running"))
        finally:
            self.lock.release()
        self.wake()
        with self._drivers_cv:
            self._drivers_cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _drain(self, deadline: float) -> None:
        def pending() -> bool:
            return any((p.sendq or p.send.unacked) and p.lost is None and p.active for p in self.peers.values())
        for peer in self.peers.values():
            peer.ack_urgent = True
        while pending() and time.monotonic() < deadline:
            self.progress_once(0.01)

    def _goodbye(self, deadline: float) -> None:
        import socket as _socket

        links = []
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    link.queue_control(Kind.BYE, peer.recv.cumulative_ack, arg=peer.send.last_seq)
                    links.append(link)
        for link in links:
            try:
                while not link.flush():
                    if time.monotonic() > deadline:
                        break
                    select.select([], [link.fd], [], 0.01)
                link.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        # Read (and drop) until the peer's EOF, so closing sends a FIN, not a RST.
        for link in links:
            try:
                link.sock.setblocking(False)
                while time.monotonic() < deadline:
                    r, _, _ = select.select([link.fd], [], [], max(0.0, deadline - time.monotonic()))
                    if not r:
                        break
                    if not link.sock.recv(1 << 16):
                        break
            except OSError:
                pass
