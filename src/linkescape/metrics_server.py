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
communicator closes; a port already taken is logged, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .metrics import CommMetrics, Exporter

log = logging.getLogger("linkescape.metrics")


class _Handler(BaseHTTPRequestHandler):
    server: "_HTTPServer"
    timeout = 5.0  # a stuck client must not hold the (single) serving thread

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
                self.send_error(404)
                return
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            log.exception("metrics: %s failed", url.path)
            self.send_error(500, str(exc))
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("metrics: " + fmt, *args)


class _HTTPServer(HTTPServer):
    allow_reuse_address = True
    owner: "MetricsServer"


class MetricsServer:
    """``/metrics`` (and ``/events``, ``/snapshot``) on ``addr:port`` from one thread."""

    def __init__(self, port: int, addr: str = "127.0.0.1") -> None:
        self.exporter = Exporter()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.exporter)
        self._comms: Dict[int, Any] = {}  # id(CommMetrics) -> communicator
        self._lock = threading.Lock()
        self.httpd = _HTTPServer((addr, port), _Handler)
        self.httpd.owner = self
        self.addr, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"linkescape-metrics-{self.port}", daemon=True)
        self.thread.start()
        log.info("metrics on http://%s:%d/metrics", self.addr, self.port)

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
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5.0)


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
    cm = CommMetrics(snapshot=comm.snapshot, recorder=recorder, info=info)
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
                log.warning("cannot serve metrics on %s:%d: %s", cfg.metrics_addr, port, exc)
                return None
            _servers.append(server)
        return Registration(server, cm, comm)


def servers() -> List[MetricsServer]:
    with _servers_lock:
        return list(_servers)


__all__ = ["MetricsServer", "Registration", "attach", "port_offset", "servers"]
