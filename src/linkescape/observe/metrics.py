"""Prometheus metrics of one process, read at scrape time.

Nothing here runs on the data path. A scrape asks every registered
communicator for ``snapshot()`` (links, channel counters, bytes per peer and
rail), reads the flight recorder's per-operation counters, and adds what the
event trail taught (``EventLog.subscribe``): link events by kind, cause and
rail, the failover histogram, time without any path.

Contract names (kept exactly; everything else is added around them):
``linkescape_bytes_sent_total{peer,rail}``, ``linkescape_bytes_received_total{peer,rail}``,
``linkescape_link_up{peer,rail}``, ``linkescape_link_events_total{event,cause,rail}``,
``linkescape_failover_seconds`` (histogram: detection -> traffic moved).

Several communicators may share one process (torch ``new_group``): the first
one registered with a server exports the plain label sets above, every later
one adds ``comm="<n>"`` so their series never collide.
"""

from __future__ import annotations

import threading
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Failover takes microseconds (carrier) to a few hundred milliseconds (silent
# loss); the default prometheus buckets start at 5 ms and would hide the fast path.
FAILOVER_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

LINK_STATES = ("connecting", "up", "down", "probing")

#: events after which a peer has a path again (ends a no-path stall)
_PATH_BACK = frozenset(("link_up", "failover", "failback"))


def _label(value: Any) -> str:
    return "" if value is None else str(value)


class CommMetrics:
    """What one communicator exports.

    ``snapshot``: a callable returning ``Communicator.snapshot()``'s dict (or
    None for a communicator without links); ``recorder``: a
    :class:`linkescape.flight.FlightRecorder` or None. ``observe_event`` is the
    ``EventLog`` subscriber.
    """

    def __init__(self, snapshot: Optional[Callable[[], Optional[dict]]] = None, recorder=None,
                 info: Optional[Mapping[str, Any]] = None) -> None:
        self.snapshot = snapshot
        self.recorder = recorder
        self.info = dict(info or {})
        self._lock = threading.Lock()
        self.link_events: Dict[Tuple[str, str, str], int] = {}
        self.failover_buckets = [0] * len(FAILOVER_BUCKETS)
        self.failover_count = 0
        self.failover_sum = 0.0
        self.last_event_ts: Dict[str, float] = {}
        # (peer, rail) -> ts of the last link_down, to time the failover that follows
        self._down_at: Dict[Tuple[Any, Any], float] = {}
        # peer -> ts of the no_path event still open; peer -> seconds of closed stalls
        self._no_path_at: Dict[Any, float] = {}
        self.stall_seconds: Dict[Any, float] = {}

    # -------------------------------------------------------------- events
    def observe_event(self, record: Mapping[str, Any]) -> None:
        """Account one event record (as ``EventLog.emit`` makes them).

        Failover time is ``ts - since`` when the record carries ``since`` (the
        detection time), else the time since the last ``link_down`` of the
        rail in ``from_rail`` (or any rail) towards the same peer.
        """
        event = record.get("event")
        peer, rail = record.get("peer"), record.get("rail")
        ts = record.get("ts")
        key = (_label(event), _label(record.get("cause")), _label(rail))
        with self._lock:
            self.link_events[key] = self.link_events.get(key, 0) + 1
            if ts is not None:
                self.last_event_ts[_label(event)] = float(ts)
            if peer is None:
                return
            if event in _PATH_BACK and peer in self._no_path_at and ts is not None:
                self.stall_seconds[peer] = (self.stall_seconds.get(peer, 0.0)
                                            + max(0.0, float(ts) - self._no_path_at.pop(peer)))
            if event == "link_down":
                if rail is not None and ts is not None:
                    self._down_at[(peer, rail)] = float(ts)
            elif event == "link_up":
                self._down_at.pop((peer, rail), None)
            elif event == "failover":
                start = record.get("since")
                if start is None:
                    start = self._detection_time(peer, record.get("from_rail"))
                if start is not None and ts is not None and float(ts) >= float(start):
                    self._observe_failover(float(ts) - float(start))
            elif event == "no_path":
                if ts is not None:
                    self._no_path_at.setdefault(peer, float(ts))
            elif event == "peer_lost":
                for k in [k for k in self._down_at if k[0] == peer]:
                    del self._down_at[k]

    def _observe_failover(self, seconds: float) -> None:
        self.failover_count += 1
        self.failover_sum += seconds
        for i, le in enumerate(FAILOVER_BUCKETS):
            if seconds <= le:
                self.failover_buckets[i] += 1

    def _detection_time(self, peer: Any, from_rail: Any) -> Optional[float]:
        if from_rail is not None and (peer, from_rail) in self._down_at:
            return self._down_at[(peer, from_rail)]
        times = [t for (p, _r), t in self._down_at.items() if p == peer]
        return max(times) if times else None

    # ------------------------------------------------------------- scrape
    def collect_into(self, fam: "_Families", extra: Mapping[str, str]) -> None:
        """Add this communicator's samples (labels ``extra`` + the metric's own)."""
        now = time.time()
        snap = None
        if self.snapshot is not None:
            try:
                snap = self.snapshot()
            except Exception:  # noqa: BLE001 - a closing communicator: export what events taught
                snap = None
        info = dict(self.info)
        if snap is not None:
            info.setdefault("rank", snap.get("rank"))
            info.setdefault("world_size", snap.get("world_size"))
        fam.gauge("linkescape_info", "The rank, world size and rail policy of a communicator (always 1)",
                  extra, {k: _label(v) for k, v in sorted(info.items())}, 1)
        if snap is not None:
            self._collect_snapshot(fam, extra, snap)
        with self._lock:
            events = dict(self.link_events)
            buckets = list(self.failover_buckets)
            count, total = self.failover_count, self.failover_sum
            stalls = dict(self.stall_seconds)
            open_stalls = dict(self._no_path_at)
            last = dict(self.last_event_ts)
        for (event, cause, rail), n in sorted(events.items()):
            fam.counter("linkescape_link_events_total", "Link events by kind, cause and rail",
                        extra, {"event": event, "cause": cause, "rail": rail}, n)
        fam.histogram("linkescape_failover_seconds", "Time from failure detection to traffic moved to another rail",
                      extra, list(zip(FAILOVER_BUCKETS, buckets)), count, total)
        for peer in sorted(set(stalls) | set(open_stalls), key=str):
            value = stalls.get(peer, 0.0) + (max(0.0, now - open_stalls[peer]) if peer in open_stalls else 0.0)
            fam.counter("linkescape_stall_seconds_total", "Seconds with no usable rail to the peer",
                        extra, {"peer": _label(peer)}, value)
        for event, ts in sorted(last.items()):
            fam.gauge("linkescape_last_event_timestamp_seconds", "Unix time of the last event of each kind",
                      extra, {"event": event}, ts)
        if self.recorder is not None:
            self._collect_ops(fam, extra, now)

    def _collect_snapshot(self, fam: "_Families", extra: Mapping[str, str], snap: Mapping[str, Any]) -> None:
        names = snap.get("rail_names") or []
        for r, name in enumerate(names):
            fam.gauge("linkescape_rail_info", "Name (interface or address) of each rail index (always 1)",
                      extra, {"rail": str(r), "name": _label(name)}, 1)
        fam.gauge("linkescape_ops_pending", "Operations in the engine, not complete", extra, {},
                  snap.get("ops_pending", 0))
        rss = resident_bytes()
        if rss is not None:
            fam.gauge("linkescape_process_resident_bytes", "Resident memory of the process (RSS), bytes", extra, {},
                      rss)
        if snap.get("relayed_pairs") is not None:
            fam.gauge("linkescape_relayed_pairs", "Pairs of other ranks whose frames this rank passes on now",
                      extra, {}, snap["relayed_pairs"])
        for key, n in sorted((snap.get("relay_bytes") or {}).items()):
            peer, _, via = str(key).partition(":")
            fam.counter("linkescape_relay_bytes_total", "Bytes sent to the peer through a relay rank (via)",
                        extra, {"peer": peer, "via": via}, n)
        if snap.get("rejected_connections") is not None:
            fam.counter("linkescape_rejected_connections_total",
                        "Incoming connections closed because they failed authentication or the handshake",
                        extra, {}, snap["rejected_connections"])
        if "store_untrusted" in snap:
            fam.gauge("linkescape_store_untrusted",
                      "1 once a store record the job did not write was read (forged, garbage, rolled back): "
                      "the store is then no evidence that a peer is gone", extra, {},
                      1 if snap["store_untrusted"] else 0)
        for peer, p in sorted((snap.get("peers") or {}).items(), key=lambda kv: int(kv[0])):
            pl = {"peer": str(peer)}
            primary = p.get("primary")
            fam.gauge("linkescape_primary_rail", "Rail carrying the traffic to the peer (-1: none)", extra, pl,
                      -1 if primary is None else primary)
            fam.counter("linkescape_frames_sent_total", "Frames numbered for the peer (channel sequence)",
                        extra, pl, p.get("sent", 0))
            fam.counter("linkescape_frames_acked_total", "Frames the peer acknowledged", extra, pl, p.get("acked", 0))
            fam.counter("linkescape_frames_received_total", "Frames applied from the peer", extra, pl,
                        p.get("received", 0))
            fam.gauge("linkescape_unacked_bytes", "Bytes sent to the peer and not acknowledged (the replay store)",
                      extra, pl, p.get("unacked_bytes", 0))
            fam.gauge("linkescape_no_path_seconds", "Seconds since the last rail to the peer went (0: a path exists)",
                      extra, pl, p.get("no_path_s") or 0.0)
            fam.gauge("linkescape_peer_lost", "1 once the peer is lost (PeerLost or LinkFailure)", extra, pl,
                      0 if p.get("lost") is None else 1)
            if p.get("replayed_bytes") is not None:
                fam.counter("linkescape_replayed_bytes_total", "Bytes sent again after a failover", extra, pl,
                            p["replayed_bytes"])
            for link in p.get("links") or []:
                ll = {"peer": str(peer), "rail": str(link.get("rail"))}
                fam.counter("linkescape_bytes_sent_total", "Bytes sent to the peer on the rail", extra, ll,
                            link.get("bytes_sent", 0))
                fam.counter("linkescape_bytes_received_total", "Bytes received from the peer on the rail", extra, ll,
                            link.get("bytes_received", 0))
                fam.gauge("linkescape_link_up", "1 while the link to the peer on the rail is usable, else 0",
                          extra, ll, 1 if link.get("usable") else 0)
                fam.gauge("linkescape_link_active", "1 while the link carries the traffic to the peer", extra, ll,
                          1 if link.get("active") else 0)
                fam.counter("linkescape_link_failures_total", "Times the link went down", extra, ll,
                            link.get("failures", 0))
                state = link.get("state")
                for s in LINK_STATES if state in LINK_STATES else (*LINK_STATES, state):
                    fam.gauge("linkescape_link_state", "1 for the link's current state", extra,
                              {**ll, "state": _label(s)}, 1 if s == state else 0)

    def _collect_ops(self, fam: "_Families", extra: Mapping[str, str], now: float) -> None:
        st = self.recorder.stats()
        for name, n in sorted(st["ops"].items()):
            fam.counter("linkescape_ops_total", "Operations completed (with or without error)", extra, {"op": name}, n)
        for name, n in sorted(st["bytes"].items()):
            fam.counter("linkescape_op_bytes_total", "Bytes of the operations' buffers (count x item size)",
                        extra, {"op": name}, n)
        for name, s in sorted(st["seconds"].items()):
            fam.counter("linkescape_op_seconds_total", "Seconds from posted to done, summed", extra, {"op": name}, s)
        for (name, err), n in sorted(st["errors"].items()):
            fam.counter("linkescape_op_errors_total", "Operations that ended with an error", extra,
                        {"op": name, "error": err}, n)
        for state in ("posted", "done"):
            fam.gauge("linkescape_collective_seq", "Sequence number of the last collective posted / done here",
                      extra, {"state": state}, st["collective_" + state])
        if st.get("ring_bytes") is not None:
            fam.gauge("linkescape_flight_recorder_bytes", "Bytes the flight recorder's ring holds (bounded by its size)",
                      extra, {}, st["ring_bytes"])
        oldest = st["oldest_pending_posted"]
        fam.gauge("linkescape_oldest_op_seconds", "Age of the oldest operation not done (0: none)", extra, {},
                  0.0 if oldest is None else max(0.0, now - oldest))


def resident_bytes():
    """The process's resident memory (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Families:
    """Metric families of one scrape, in first-seen order, samples merged across communicators."""

    def __init__(self) -> None:
        self._fams: Dict[str, Metric] = {}

    def _get(self, cls, name: str, doc: str, labels: Sequence[str], **kw) -> Metric:
        fam = self._fams.get(name)
        if fam is None:
            fam = cls(name, doc, labels=list(labels), **kw)
            self._fams[name] = fam
        return fam

    def counter(self, name: str, doc: str, extra: Mapping[str, str], labels: Mapping[str, str], value) -> None:
        self._add(CounterMetricFamily, name, doc, extra, labels, value)

    def gauge(self, name: str, doc: str, extra: Mapping[str, str], labels: Mapping[str, str], value) -> None:
        self._add(GaugeMetricFamily, name, doc, extra, labels, value)

    def _add(self, cls, name, doc, extra, labels, value) -> None:
        lab = {**labels, **extra}
        fam = self._get(cls, name, doc, ())
        sample_name = name if cls is GaugeMetricFamily or name.endswith("_total") else name + "_total"
        fam.add_sample(sample_name, lab, float(value))

    def histogram(self, name: str, doc: str, extra: Mapping[str, str], buckets: List[Tuple[float, int]],
                  count: int, total: float) -> None:
        fam = self._get(HistogramMetricFamily, name, doc, ())
        for le, n in buckets:
            fam.add_sample(name + "_bucket", {**extra, "le": _floatstr(le)}, float(n))
        fam.add_sample(name + "_bucket", {**extra, "le": "+Inf"}, float(count))
        fam.add_sample(name + "_count", dict(extra), float(count))
        fam.add_sample(name + "_sum", dict(extra), float(total))

    def __iter__(self):
        return iter(self._fams.values())


def _floatstr(v: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(v)


class Exporter(Collector):
    """A prometheus Collector over the communicators registered with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: List[Tuple[Dict[str, str], CommMetrics]] = []
        self._next = 0

    def add(self, cm: CommMetrics) -> Dict[str, str]:
        """Register; returns the extra labels its series carry (``{}`` for the first)."""
        with self._lock:
            extra = {} if self._next == 0 else {"comm": str(self._next)}
            self._next += 1
            self._members.append((extra, cm))
            return extra

    def remove(self, cm: CommMetrics) -> int:
        """Unregister; returns how many stay."""
        with self._lock:
            self._members = [(e, m) for e, m in self._members if m is not cm]
            return len(self._members)

    def members(self) -> List[Tuple[Dict[str, str], CommMetrics]]:
        with self._lock:
            return list(self._members)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        fam = _Families()
        for extra, cm in self.members():
            cm.collect_into(fam, extra)
        return list(fam)


class Metrics(CommMetrics):
    """One communicator's metrics in a registry of their own (tests, embedding
    in an application's own HTTP server): ``generate_latest()`` is the text."""

    def __init__(self, snapshot: Optional[Callable[[], Optional[dict]]] = None, recorder=None,
                 info: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(snapshot, recorder, info)
        self.exporter = Exporter()
        self.exporter.add(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.exporter)

    def generate_latest(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CommMetrics", "Exporter", "Metrics", "FAILOVER_BUCKETS", "LINK_STATES"]
