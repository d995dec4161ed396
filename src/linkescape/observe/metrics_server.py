"""One HTTP server per process for the metrics of every communicator in it.

With ``LINKESCAPE_METRICS_PORT=P`` a rank serves on ``P + offset``, on
``LINKESCAPE_METRICS_ADDR`` (default 127.0.0.1: the endpoint is not
authenticated). The offset is ``LOCAL_RANK`` when set (torchrun: the same
ports on every host), else the rank. Paths:

- ``/metrics``: Prometheus text format (see ``linkescape.metrics``);
- ``/events?n=50``: the last link events of every communicator, JSON;
- ``/snapshot``: ``Communicator.snapshot()`` of every communicator, JSON.

Communicators of one process share the server (torch ``new_group``): a
communicator joins the process's server unless one of its own job's ranks is
already registered there (several ranks emulated in one process, as tests
do), which then gets a server on its own port. The server stops when its last
communicator closes; a port already taken is logged as an error (whoever holds
it is not this rank), never raised.

No client can hang anything:

- Requests are served concurrently, each on a daemon thread, so a slow client
  never holds up ``/metrics`` or ``/healthz`` for another one. At most
  ``MAX_CONNECTIONS`` are served at once: one more closes the oldest.
- Every request has a whole-request deadline (``REQUEST_DEADLINE``: reading
  the request and writing the answer together), not a per-read timeout, so a
  client sending one byte a second is cut off.
- ``close()`` is bounded (``CLOSE_WAIT``): it cuts every connection in
  flight and never waits for a client, so ``Communicator.close()`` and
  ``abort()`` return at once whatever a client does.
- A communicator's snapshot (which takes its engine lock) is taken at most
  every ``SNAPSHOT_MAX_AGE`` seconds, however many clients ask, and never
  while a client reads: the answer is built, the lock released, then written.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .metrics import CommMetrics, Exporter

log = logging.getLogger("linkescape.metrics")

#: seconds a whole request may take: reading it and writing the answer
REQUEST_DEADLINE = 5.0
#: connections served at once; one more closes the oldest
MAX_CONNECTIONS = 32
#: a communicator's snapshot is taken at most this often (each takes the engine lock)
SNAPSHOT_MAX_AGE = 0.5
#: close() waits at most this long for the serving thread
CLOSE_WAIT = 0.5
#: how often the serving thread looks at its stop flag
POLL_INTERVAL = 0.05


class _DeadlineReader:
    """The request's bytes, read straight from the socket with the time left
    before the request's deadline as each read's timeout: a client that
    trickles bytes runs out of time, not the server out of threads."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def _fill(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(left)
        return self.sock.recv(4096)

    def readline(self, limit: int = -1) -> bytes:
        if limit == 0:
            return b""
        while True:
            end = self.buf.find(b"\n") + 1
            if limit > 0 and (end == 0 or end > limit) and len(self.buf) >= limit:
                end = limit  # the limit comes first (http.server reads lines of at most 65537)
            if end:
                line, self.buf = self.buf[:end], self.buf[end:]
                return line
            chunk = self._fill()
            if not chunk:
                line, self.buf = self.buf, b""
                return line
            self.buf += chunk

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            chunk = self._fill()
            if not chunk:
                break
            self.buf += chunk
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out

    def close(self) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    server: "_HTTPServer"

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + self.server.request_deadline
        self.rfile.close()  # the buffered reader: requests are read with the deadline instead
        self.rfile = _DeadlineReader(self.connection, self.deadline)  # type: ignore[assignment]

    def _time_left(self) -> None:
        """Writes get what is left of the request's deadline (sendall's
        timeout bounds the whole call)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self.connection.settimeout(left)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        owner = self.server.owner
        try:
            if url.path in ("/metrics", "/"):
                body, ctype = generate_latest(owner.registry), CONTENT_TYPE_LATEST
            elif url.path == "/events":
                n = int((parse_qs(url.query).get("n") or ["50"])[0])
                body, ctype = json.dumps(owner.events(n), default=str).encode(), "application/json"
            elif url.path == "/snapshot":
                body, ctype = json.dumps(owner.snapshots(), default=str).encode(), "application/json"
            elif url.path == "/healthz":
                body, ctype = b"ok\n", "text/plain"
            else:
                body, ctype = None, ""
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            log.exception("metrics: %s failed", url.path)
            self._time_left()
            self.send_error(500, str(exc))
            return
        # the body is built (and any snapshot lock released): now the client reads
        self._time_left()
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._time_left()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("metrics: " + fmt, *args)


class _HTTPServer(ThreadingHTTPServer):
    """A thread per connection (daemon: never joined), at most
    ``max_connections`` at once, each cut at its deadline or at close."""

    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False
    timeout = POLL_INTERVAL  # handle_request() returns this often without a client
    owner: "MetricsServer"

    def __init__(self, address, handler, request_deadline: float = REQUEST_DEADLINE,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.request_deadline = request_deadline
        self.max_connections = max_connections
        self.active: Dict[socket.socket, float] = {}
        self.active_lock = threading.Lock()
        self.closing = False
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        with self.active_lock:
            if self.closing:
                refused = True
            else:
                refused = False
                while len(self.active) >= self.max_connections:  # the oldest makes room
                    oldest = min(self.active, key=self.active.__getitem__)
                    del self.active[oldest]
                    _cut(oldest)
                self.active[request] = time.monotonic()
        if refused:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self.active_lock:
            self.active.pop(request, None)
        super().shutdown_request(request)

    def cut_all(self) -> None:
        """End every connection in flight (their threads see EOF or an error)."""
        with self.active_lock:
            self.closing = True
            for sock in list(self.active):
                _cut(sock)
            self.active.clear()

    def handle_error(self, request, client_address) -> None:
        # a client that timed out or went away: not worth a traceback on stderr
        exc = sys.exc_info()[1]
        log.debug("metrics: request from %s ended: %s: %s", client_address, type(exc).__name__, exc)


def _cut(sock: socket.socket) -> None:
    """Wake the thread blocked on ``sock`` (it closes the socket itself: a
    descriptor closed under another thread could be reused meanwhile)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _CachedSnapshot:
    """``snapshot()`` at most every ``max_age`` seconds: each one takes the
    communicator's engine lock, so however many clients scrape, the engine
    pays for at most a couple a second. Callers at the same time share one."""

    def __init__(self, snapshot: Callable[[], Optional[dict]], max_age: float = SNAPSHOT_MAX_AGE) -> None:
        self.snapshot = snapshot
        self.max_age = max_age
        self._lock = threading.Lock()
        self._value: Optional[dict] = None
        self._at = float("-inf")
        #: snapshots actually taken (the tests count them)
        self.taken = 0

    def __call__(self) -> Optional[dict]:
        with self._lock:
            if time.monotonic() - self._at >= self.max_age:
                self._value = self.snapshot()
                self._at = time.monotonic()
                self.taken += 1
            return self._value


class MetricsServer:
    """``/metrics`` (and ``/events``, ``/snapshot``, ``/healthz``) on
    ``addr:port``: one thread accepts, a daemon thread per connection serves."""

    def __init__(self, port: int, addr: str = "127.0.0.1", request_deadline: float = REQUEST_DEADLINE,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.exporter = Exporter()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.exporter)
        self._comms: Dict[int, Any] = {}  # id(CommMetrics) -> communicator
        self._lock = threading.Lock()
        self.httpd = _HTTPServer((addr, port), _Handler, request_deadline, max_connections)
        self.httpd.owner = self
        self.addr, self.port = self.httpd.server_address[:2]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=f"linkescape-metrics-{self.port}", daemon=True)
        self.thread.start()
        log.info("metrics on http://%s:%d/metrics", self.addr, self.port)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.httpd.handle_request()  # returns within POLL_INTERVAL without a client
            except (OSError, ValueError):  # the socket closed under us: close() is under way
                if self._stop.is_set():
                    return
                time.sleep(POLL_INTERVAL)

    # ------------------------------------------------------------ members
    def add(self, cm: CommMetrics, comm: Any = None) -> Dict[str, str]:
        with self._lock:
            self._comms[id(cm)] = comm
        return self.exporter.add(cm)

    def remove(self, cm: CommMetrics) -> int:
        with self._lock:
            self._comms.pop(id(cm), None)
        return self.exporter.remove(cm)

    def jobs(self) -> List[Any]:
        with self._lock:
            return [getattr(c, "job", None) for c in self._comms.values()]

    def events(self, n: int) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for extra, cm in self.exporter.members():
            comm = self._comms.get(id(cm))
            ev = getattr(comm, "events", None)
            if ev is None:
                continue
            for rec in ev.recent(n):
                out.append({**rec, **extra})
        out.sort(key=lambda r: r.get("ts") or 0.0)
        return out[-n:] if n > 0 else []

    def snapshots(self) -> List[Dict[str, Any]]:
        out = []
        for extra, cm in self.exporter.members():
            try:
                snap = cm.snapshot() if cm.snapshot is not None else None
            except Exception:  # noqa: BLE001 - closing
                snap = None
            if snap is not None:
                out.append({**snap, **extra})
        return out

    def close(self) -> None:
        """Stop serving: bounded by ``CLOSE_WAIT``, whatever a client does
        (connections in flight are cut, their threads are never waited for)."""
        self._stop.set()
        self.httpd.cut_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=CLOSE_WAIT)
        self.httpd.server_close()


# ------------------------------------------------------------------ process-wide registry
_servers: List[MetricsServer] = []
_servers_lock = threading.Lock()


def port_offset(rank: int, environ=None) -> int:
    """``LOCAL_RANK`` when set (several ranks per host, same ports on every host), else the rank."""
    env = os.environ if environ is None else environ
    raw = env.get("LOCAL_RANK")
    if raw not in (None, ""):
        try:
            return int(raw)
        except ValueError:
            log.warning("LOCAL_RANK=%r is not an integer; the metrics port is offset by the rank", raw)
    return int(rank)


class Registration:
    """A communicator's place on a server; ``close()`` unregisters (and stops
    the server when it was the last)."""

    def __init__(self, server: MetricsServer, cm: CommMetrics, comm: Any) -> None:
        self.server = server
        self.metrics = cm
        self.comm = comm
        self.labels = server.add(cm, comm)
        events = getattr(comm, "events", None)
        self._events = events
        if events is not None:
            events.subscribe(cm.observe_event)
        self.closed = False

    @property
    def port(self) -> int:
        return self.server.port

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._events is not None:
            self._events.unsubscribe(self.metrics.observe_event)
        with _servers_lock:
            left = self.server.remove(self.metrics)
            if left == 0 and self.server in _servers:
                _servers.remove(self.server)
            else:
                return
        self.server.close()


def attach(comm, recorder=None) -> Optional[Registration]:
    """Register ``comm`` (a Communicator) with this process's metrics server,
    starting it if needed; None when ``comm.config.metrics_port`` is unset or
    the port cannot be bound."""
    cfg = comm.config
    if cfg.metrics_port is None:
        return None
    info = {"rank": comm.rank, "world_size": comm.world_size, "policy": cfg.policy}
    cm = CommMetrics(snapshot=_CachedSnapshot(comm.snapshot), recorder=recorder, info=info)
    job = getattr(comm, "job", None)
    with _servers_lock:
        server = None
        for s in _servers:
            if job is not None and job in s.jobs():
                continue  # a sibling rank of the same job: it needs a port of its own
            server = s
            break
        if server is None:
            offset = port_offset(comm.rank) if not _servers else int(comm.rank)
            port = cfg.metrics_port + offset
            try:
                server = MetricsServer(port, cfg.metrics_addr)
            except OSError as exc:
                # (not fatal: monitoring never stops training) but loud: another process may hold the
                # port, and whatever answers there is not this rank (issue 48)
                log.error("cannot serve metrics on %s:%d: %s; another process holds the port, and whatever "
                          "answers there is NOT rank %d: scrapers and `linkescape status` must not trust it "
                          "(choose another LINKESCAPE_METRICS_PORT)", cfg.metrics_addr, port, exc, comm.rank)
                return None
            _servers.append(server)
        return Registration(server, cm, comm)


def servers() -> List[MetricsServer]:
    with _servers_lock:
        return list(_servers)


__all__ = ["MetricsServer", "Registration", "attach", "port_offset", "servers"]
