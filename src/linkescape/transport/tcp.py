"""TCP transport: sockets, their options, and dialing a link.

A link is one TCP connection between two ranks on one rail (rail i to rail i).
The higher rank connects to the lower one and speaks first (the handshake:
protocol/handshake.py; the accepting side: acceptor.py). Sockets are
non-blocking; a ``Dial`` advances one connect and handshake whenever its
socket is ready (start-up runs many from one thread), ``connect`` waits for
one with a deadline.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
from typing import Optional, Tuple

try:  # (at import: an import inside start-up waits for the disk on a loaded host)
    import resource
except ImportError:  # pragma: no cover - not on Linux
    resource = None  # type: ignore[assignment]

from ..common.config import Config
from ..common.errors import AuthError, ConfigError, HandshakeError
from ..protocol.handshake import DialerHandshake, Established

log = logging.getLogger("linkescape.transport")

TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)
#: Linux 6.15+: the socket's minimum retransmission timeout, in microseconds
TCP_RTO_MIN_US = getattr(socket, "TCP_RTO_MIN_US", 45)
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def tune(sock: socket.socket, config: Config) -> None:
    """Socket options shared by both ends of a link."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if config.socket_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.socket_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, config.socket_buffer)
    if config.tcp_congestion:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, config.tcp_congestion.encode())
        except OSError as exc:
            log.warning("cannot set TCP congestion control %s: %s", config.tcp_congestion, exc)
    # The kernel should give up on a dead path a little after our own silence
    # detection has already moved the traffic (so a dead socket is reaped
    # rather than blocking for ~15 minutes), never before it.
    # Not sooner: a healthy but saturated rail (a shaper dropping a replay
    # burst) can back off its retransmissions past a second, and the kernel
    # giving up there would take a live path for a dead one.
    user_timeout_ms = int(max(25 * config.silent_timeout, 5.0) * 1000)
    sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, user_timeout_ms)
    # A packet lost on a rail (a shaper's queue overflowing under a replay
    # burst, a lossy optic) costs a retransmission timeout, never less than
    # 200 ms by default, doubling each time: a rail's round trip is tens of
    # microseconds. Where the kernel allows it per socket, the floor is
    # LINKESCAPE_TCP_RTO_MIN_MS (the smoothed RTT estimate still applies).
    if config.tcp_rto_min:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, int(config.tcp_rto_min * 1e6))
        except OSError:
            pass  # an older kernel: its default floor
    # Keepalive only reaps a socket whose peer vanished while nothing was
    # sent for long: the engine's own probes find a silent idle link. So it
    # is rare (a packet a minute per idle link), not a per-link heartbeat.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)
#: seconds a link is idle before its kernel sends a keepalive
KEEPALIVE_IDLE = 60


def ack_silence(sock: socket.socket) -> Optional[float]:
    """Seconds since the peer's kernel last acknowledged anything, while bytes
    of ours wait for it (in flight, or queued because the NIC drops them);
    None when nothing is outstanding or the peer's window is closed.

    The peer's kernel answers for it: a peer process that is merely busy
    (holding the GIL, swapping) still gets its bytes acknowledged, so only a
    path that really lost packets goes silent here. A closed window means
    the peer acknowledged and is just not reading: alive.
    """
    info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 232)
    unacked = int.from_bytes(info[24:28], "little")
    notsent = int.from_bytes(info[144:148], "little") if len(info) >= 148 else 0
    if not unacked and not notsent:
        return None
    # A (nearly) closed window means the peer acknowledged and is just not
    # reading (or its kernel dropped what did not fit): alive, flow-controlled.
    # With an open window, bytes in flight or stuck in our own queue (a NIC
    # that drops them) and no acknowledgement is silence.
    snd_wnd = int.from_bytes(info[228:232], "little") if len(info) >= 232 else 1 << 30
    mss = int.from_bytes(info[16:20], "little") or 1460
    if snd_wnd < 2 * mss:
        return None
    return int.from_bytes(info[56:60], "little") / 1000.0  # tcpi_last_ack_recv, ms


def ack_now(sock: socket.socket) -> None:
    """Have the kernel send now the acknowledgement it may be holding back.

    A lone small segment (a probe, a heartbeat) is acknowledged with a delay
    (``TCP_DELACK_MIN`` 40 ms, up to the round-trip estimate or 200 ms) once a
    connection looks interactive, and the sender's silence check counts that
    delay as silence. Reading the segment and setting ``TCP_QUICKACK`` sends
    the pending acknowledgement at once (measured on loopback: 44 ms median
    without, 5 ms when read 5 ms after it came). A socket that is not TCP
    (a test's socketpair) is left alone."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
    except OSError:
        pass


def tcp_info_summary(sock: socket.socket) -> str:
    info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 232)
    u32 = lambda o: int.from_bytes(info[o:o + 4], "little")  # noqa: E731
    return (f"unacked={u32(24)} notsent={u32(144)} snd_wnd={u32(228)} mss={u32(16)} "
            f"last_ack_recv={u32(56)}ms last_data_recv={u32(52)}ms probes={info[3]} backoff={info[4]}")


def listen(address: str, backlog: int = 1024) -> socket.socket:
    """A non-blocking listener on ``address`` (any port). The backlog is deep
    so that a burst of strangers' connections cannot crowd out a re-dial
    before the acceptor takes them (the kernel caps it at somaxconn)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def connect(local: str, remote: Tuple[str, int], handshake: DialerHandshake, config: Config,
            deadline: float) -> Tuple[socket.socket, Established]:
    """Open a link and run the handshake as the dialing side (blocking, with
    a deadline): one :class:`Dial`, waited on alone. Returns a non-blocking
    socket. Raises OSError (unreachable, refused, timed out, closed by the
    acceptor), HandshakeError (refused, or a malformed answer) or AuthError
    (the key proof failed on either side)."""
    dial = Dial(local, remote, handshake, config, deadline)
    try:
        poller = select.poll()
        while not dial.step(time.monotonic()):
            poller.register(dial.fileno(), select.POLLIN | (select.POLLOUT if dial.wants_write else 0))
            poller.poll(max(1.0, 1000 * (deadline - time.monotonic())))
        return dial.sock, dial.established
    except BaseException:
        dial.close()
        raise


class Dial:
    """One non-blocking dial: connect, then the dialing side of the
    handshake, advanced by :meth:`step` whenever the socket is ready (many
    dials share one thread and one ``poll``). ``step`` returns True once
    established (the socket is then the link's), and raises as ``connect``
    does; :meth:`close` drops a dial that will not finish."""

    def __init__(self, local: str, remote: Tuple[str, int], handshake: DialerHandshake, config: Config,
                 deadline: float, connect_by: Optional[float] = None) -> None:
        self.handshake = handshake
        #: the whole dial fails past this; the TCP connection alone past ``connect_by`` (a SYN that
        #: vanished on a black-holed path is given up soon, a peer that answered is given time)
        self.deadline = deadline
        self.connect_by = deadline if connect_by is None else min(connect_by, deadline)
        self.connected = False
        #: when the dial began (its owner may set it on its own clock)
        self.started = time.monotonic()
        #: a link's first connection (its owner's business: recovery gives those more time)
        self.first = False
        self.established: Optional[Established] = None
        self._out = b""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tune(sock, config)
            try:
                # the port is picked at connect, for the whole 4-tuple: a
                # port bound first may clash with a TIME_WAIT connection to
                # the same peer (EADDRINUSE), and it is taken from every
                # destination's share of the ephemeral range, not one
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            except OSError:
                pass
            sock.bind((local, 0))
            sock.setblocking(False)
            err = sock.connect_ex(remote)
            if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                raise OSError(err, f"connect to {remote[0]}:{remote[1]}: {errno.errorcode.get(err, err)}")
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        # On a near link (loopback, one switch) the connection is up already:
        # send the HELLO now, so an acceptor that is being flooded finds this
        # dial advanced at once (it evicts connections with no HELLO first).
        try:
            self.step(time.monotonic())
        except BaseException:
            sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def done(self) -> bool:
        """Established, and everything of ours sent."""
        return self.handshake.done and not self._out

    @property
    def proved(self) -> bool:
        """Our proof is sent and the answer not read yet: the acceptor may
        count the link as up already (it adopts it as it sends ACCEPT)."""
        return self.handshake.state == "accept" and not self._out

    @property
    def wants_write(self) -> bool:
        return not self.connected or bool(self._out)

    def step(self, now: float) -> bool:
        if self.done:
            return True  # done already (near peers can finish in the first step)
        if now > self.deadline:
            raise socket.timeout("dial timed out")
        hs = self.handshake
        if not self.connected:
            if now > self.connect_by:
                raise socket.timeout("connect timed out")
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect: {errno.errorcode.get(err, err)}")
            try:
                self.sock.getpeername()
            except OSError:
                return False  # still connecting
            self.connected = True
        while True:
            self._out += hs.data_to_send()
            if self._out:
                try:
                    sent = self.sock.send(self._out)
                except (BlockingIOError, InterruptedError):
                    return False
                self._out = self._out[sent:]
                if self._out:
                    return False
            if hs.done:
                return True
            try:
                chunk = self.sock.recv(hs.want())
            except (BlockingIOError, InterruptedError):
                return False
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "connection closed during handshake")
            event = hs.receive_data(chunk, now)
            if isinstance(event, Established):
                self.established = event

    @property
    def due(self) -> float:
        """When :meth:`step` must run even if the socket stays quiet."""
        return self.deadline if self.connected else self.connect_by

    def close(self) -> None:
        self.sock.close()


def route_source(host: str) -> str:
    """The local address the kernel would use to reach ``host`` (no packet sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((socket.gethostbyname(host), 9))
        return probe.getsockname()[0]
    finally:
        probe.close()


class ListenerProbe:
    """A non-blocking connect to a peer's listener, closed at once: a refusal
    (RST) says nobody listens there."""

    def __init__(self, peer: int, rail: int, local: str, remote: Tuple[str, int], deadline: float) -> None:
        self.peer = peer
        self.rail = rail
        self.deadline = deadline
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.err = 0
        try:
            self.sock.bind((local, 0))
            self.err = self.sock.connect_ex(remote)
        except OSError as exc:
            self.err = exc.errno or errno.EIO
        if self.err in (errno.EINPROGRESS, errno.EAGAIN):
            self.err = -1  # pending

    def fileno(self) -> int:
        return self.sock.fileno()

    def finish(self, ready: bool = True) -> Tuple[bool, bool]:
        """(refused, answered): whether the listener refused the connection, or
        accepted it. ``ready``: the connect ended (else its deadline passed: no answer)."""
        if self.err == -1:
            if not ready:
                self.sock.close()
                return False, False
            self.err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self.sock.close()
        return self.err == errno.ECONNREFUSED, self.err == 0


__all__ = ["tune", "ack_silence", "ack_now", "listen", "connect", "Dial", "ListenerProbe", "route_source", "HandshakeError", "AuthError"]


def tcp_sample(sock: socket.socket, now: float):
    """The kernel counters the grey-failure detector needs (TCP_INFO)."""
    from ..protocol.grey import TcpSample

    info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 232)

    def u32(o: int) -> int:
        return int.from_bytes(info[o:o + 4], "little") if len(info) >= o + 4 else 0

    def u64(o: int) -> int:
        return int.from_bytes(info[o:o + 8], "little") if len(info) >= o + 8 else 0
    return TcpSample(now=now, acked=u64(120), busy_us=u64(168), rwnd_us=u64(176), sent=u64(200),
                     retrans=u64(208), retrans_segs=u32(100), data_segs=u32(156))


#: descriptors kept free beside the links (listeners, the store, logs, the user's own files)
FD_HEADROOM = 256


def ensure_fd_budget(links: int) -> Tuple[int, int]:
    """Every link is opened at start-up (backups are pre-created), so a rank
    holds ``links`` = (N-1) x rails sockets. When the soft ``ulimit -n`` is
    too low for that, raise it to the hard limit (as a process may) and say
    so; when even the hard limit is too low, fail now with the fix rather
    than with EMFILE half-way through start-up. Returns (soft, hard) after."""
    if resource is None:  # pragma: no cover - not on Linux
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = links + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(f"{links} links need about {need} file descriptors, but the hard limit "
                              f"(ulimit -Hn) is {hard}: raise it (LimitNOFILE= in systemd, --ulimit nofile= "
                              f"in docker, /etc/security/limits.conf)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.warning("raised the soft limit of open files (ulimit -n) from %d to %s for %d links",
                    soft, "unlimited" if hard == resource.RLIM_INFINITY else hard, links)
        soft = hard
    return soft, hard
