"""Prometheus metrics of one process.

Each ``Metrics`` owns its own ``CollectorRegistry`` rather than the global
default one: several communicators (or tests) in one process must not collide
on metric names, and an application's own metrics stay out of our endpoint.

``Metrics.observe_event`` takes the records ``EventLog.emit`` produces, so
wiring is one line: ``event_log.subscribe(metrics.observe_event)``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, Mapping, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PORT_VAR = "LINKESCAPE_METRICS_PORT"
ADDR_VAR = "LINKESCAPE_METRICS_ADDR"

# Failover is expected in the sub-millisecond (carrier) to second (timeout)
# range; the default prometheus buckets start at 5 ms and would hide the fast path.
FAILOVER_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

log = logging.getLogger("linkescape.metrics")


def _label(value: Any) -> str:
    return "" if value is None else str(value)


class Metrics:
    """Counters and gauges of link health and traffic for one process."""

    def __init__(self, registry: Optional[CollectorRegistry] = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.link_events = Counter("linkescape_link_events", "Link events by kind, cause and rail",
                                   ("event", "cause", "rail"), registry=r)
        self.bytes_sent = Counter("linkescape_bytes_sent", "Payload bytes sent", ("peer", "rail"), registry=r)
        self.bytes_received = Counter("linkescape_bytes_received", "Payload bytes received",
                                      ("peer", "rail"), registry=r)
        self.link_up = Gauge("linkescape_link_up", "1 if the link to peer on rail is usable",
                             ("peer", "rail"), registry=r)
        self.failover_seconds = Histogram("linkescape_failover_seconds",
                                          "Time from failure detection to traffic moved to another rail",
                                          buckets=FAILOVER_BUCKETS, registry=r)
        self._lock = threading.Lock()
        # (peer, rail) -> ts of the last link_down, to time a failover whose
        # event carries no explicit detection time
        self._down_at: Dict[Tuple[Any, Any], float] = {}

    # ------------------------------------------------------------- traffic
    def add_sent(self, peer: int, rail: int, nbytes: int) -> None:
        self.bytes_sent.labels(_label(peer), _label(rail)).inc(nbytes)

    def add_received(self, peer: int, rail: int, nbytes: int) -> None:
        self.bytes_received.labels(_label(peer), _label(rail)).inc(nbytes)

    def set_link_up(self, peer: int, rail: int, up: bool) -> None:
        self.link_up.labels(_label(peer), _label(rail)).set(1 if up else 0)

    # -------------------------------------------------------------- events
    def observe_event(self, record: Mapping[str, Any]) -> None:
        """Account one event record (as produced by ``EventLog.emit``).

        Failover time is ``ts - since`` when the record has ``since`` (the
        detection time), else the time since the last ``link_down`` of the
        rail in ``from_rail`` (or any rail) towards the same peer.
        """
        event = record.get("event")
        peer, rail = record.get("peer"), record.get("rail")
        ts = record.get("ts")
        self.link_events.labels(_label(event), _label(record.get("cause")), _label(rail)).inc()
        if peer is None:
            return
        with self._lock:
            if event == "link_down":
                if rail is not None:
                    self.set_link_up(peer, rail, False)
                    if ts is not None:
                        self._down_at[(peer, rail)] = float(ts)
            elif event == "link_up":
                if rail is not None:
                    self.set_link_up(peer, rail, True)
                self._down_at.pop((peer, rail), None)
            elif event == "failover":
                start = record.get("since")
                if start is None:
                    start = self._detection_time(peer, record.get("from_rail"))
                if start is not None and ts is not None and float(ts) >= float(start):
                    self.failover_seconds.observe(float(ts) - float(start))
            elif event == "peer_lost":
                for key in [k for k in self._down_at if k[0] == peer]:
                    del self._down_at[key]

    def _detection_time(self, peer: Any, from_rail: Any) -> Optional[float]:
        if from_rail is not None and (peer, from_rail) in self._down_at:
            return self._down_at[(peer, from_rail)]
        times = [t for (p, _r), t in self._down_at.items() if p == peer]
        return max(times) if times else None

    # -------------------------------------------------------------- export
    def generate_latest(self) -> bytes:
        return generate_latest(self.registry)


_default: Optional[Metrics] = None
_default_lock = threading.Lock()


def default_metrics() -> Metrics:
    """The process-wide instance (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Metrics()
        return _default


def start_metrics_server(port: int, metrics: Optional[Metrics] = None, addr: str = "127.0.0.1"):
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread.

    Loopback by default: the endpoint is unauthenticated. Returns the server
    (call ``.shutdown()`` to stop it) where prometheus_client provides it.
    """
    from prometheus_client import start_http_server

    metrics = metrics if metrics is not None else default_metrics()
    result = start_http_server(port, addr=addr, registry=metrics.registry)
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return result[0] if isinstance(result, tuple) else result


def maybe_start_from_env(rank: int, metrics: Optional[Metrics] = None,
                         environ: Optional[Mapping[str, str]] = None):
    """Start the server on ``$LINKESCAPE_METRICS_PORT + rank`` if the variable is set.

    The rank offset lets every rank of a node serve from one setting. The bind
    address is ``$LINKESCAPE_METRICS_ADDR`` (default 127.0.0.1). A port already
    in use is logged, not raised: metrics must never take a job down.
    """
    env = os.environ if environ is None else environ
    raw = env.get(PORT_VAR)
    if not raw:
        return None
    try:
        port = int(raw) + int(rank)
    except ValueError:
        log.warning("%s=%r is not a port number; metrics disabled", PORT_VAR, raw)
        return None
    try:
        return start_metrics_server(port, metrics, env.get(ADDR_VAR) or "127.0.0.1")
    except OSError as exc:
        log.warning("cannot serve metrics on port %d: %s", port, exc)
        return None


__all__ = ["Metrics", "default_metrics", "start_metrics_server", "maybe_start_from_env",
           "PORT_VAR", "ADDR_VAR", "FAILOVER_BUCKETS"]
