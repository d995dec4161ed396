"""``linkescape status``: a live terminal view of a running job, from its metrics endpoints.

Every rank x peer x rail with its state and bytes/s, which rail is primary,
the relays (a peer reached through a third rank: "via R", with the bytes sent
through it; and how many pairs of other ranks each rank passes on), and the
last events of every rank. The relays come from the endpoint's ``/snapshot``
(per peer ``via``), or, from an endpoint without it, from the metrics
``linkescape_relay_bytes_total{peer,via}`` (a peer whose count grew since the
last scrape is relayed through that ``via``) and ``linkescape_relayed_pairs``. Targets: ``--targets host:port,...``, or
the ranks of a testbed (``--testbed NAME``, default ``le``): for host ``i``
``127.0.0.1:P+i`` then ``127.0.0.1:P`` inside its network namespace, so a job
started with ``LINKESCAPE_METRICS_PORT=P`` is found whether each host runs
one rank (``P + rank``) or torchrun (``P + LOCAL_RANK``).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..common import extras
from ..common.errors import UsageError

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    netns: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.netns + ':' if self.netns else ''}{self.host}:{self.port}"


def parse_targets(text: str) -> List[Target]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise UsageError(f"target {part!r} is not host:port")
        out.append(Target(host.strip("[]"), int(port)))
    if not out:
        raise UsageError("--targets names no target")
    return out


#: the most bytes ``linkescape status`` reads from one metrics endpoint (a rank's
#: /metrics is tens of KiB; whatever answers on that port may send without end)
MAX_RESPONSE = 8 << 20


def _http_get(host: str, port: int, path: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"{host}:{port}{path} did not answer within {timeout:g} s")
            s.settimeout(left)
            b = s.recv(65536)
            if not b:
                break
            size += len(b)
            if size > MAX_RESPONSE:
                raise OSError(f"{host}:{port}{path} sent more than {MAX_RESPONSE} bytes: not a linkescape rank")
            chunks.append(b)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise OSError(f"HTTP {status[1:2]} from {host}:{port}{path}")
    return body


def _in_netns(netns: str, fn):
    """Run ``fn()`` in a thread that entered network namespace ``netns``."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({netns}) failed")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name="linkescape-status-netns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def fetch(target: Target, path: str, timeout: float = 2.0) -> bytes:
    def get() -> bytes:
        return _http_get(target.host, target.port, path, timeout)

    return _in_netns(target.netns, get) if target.netns else get()


def parse_metrics(text: str) -> Dict[str, Any]:
    """The parts of one rank's /metrics the view needs."""
    parser = extras.module("prometheus_client.parser", "metrics", "linkescape status")
    out: Dict[str, Any] = {"rank": None, "world_size": None, "rails": {}, "links": {}, "primary": {},
                           "ops_pending": None, "oldest_op_s": None, "collective": {}, "lost": {}, "no_path": {},
                           "via": {}, "relay_bytes": {}, "relay_bytes_total": {}, "relayed_pairs": None}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("comm"):
                continue  # the view shows each process's first communicator (the world)
            name, lab, v = s.name, s.labels, s.value
            if name == "linkescape_info":
                out["rank"] = int(lab.get("rank", -1))
                out["world_size"] = int(lab.get("world_size", 0))
            elif name == "linkescape_rail_info":
                out["rails"][int(lab["rail"])] = lab.get("name")
            elif name == "linkescape_primary_rail":
                out["primary"][int(lab["peer"])] = int(v)
            elif name == "linkescape_ops_pending":
                out["ops_pending"] = int(v)
            elif name == "linkescape_oldest_op_seconds":
                out["oldest_op_s"] = v
            elif name == "linkescape_collective_seq":
                out["collective"][lab.get("state")] = int(v)
            elif name == "linkescape_peer_lost":
                out["lost"][int(lab["peer"])] = bool(v)
            elif name == "linkescape_no_path_seconds":
                out["no_path"][int(lab["peer"])] = v
            elif name == "linkescape_relayed_pairs":
                out["relayed_pairs"] = int(v)
            elif name == "linkescape_relay_bytes_total":
                out["relay_bytes_total"][f"{lab.get('peer')}:{lab.get('via')}"] = int(v)
            elif name in ("linkescape_bytes_sent_total", "linkescape_bytes_received_total", "linkescape_link_up",
                          "linkescape_link_state", "linkescape_link_active"):
                key = (int(lab["peer"]), int(lab["rail"]))
                link = out["links"].setdefault(key, {})
                if name == "linkescape_link_state":
                    if v:
                        link["state"] = lab.get("state")
                else:
                    link[{"linkescape_bytes_sent_total": "sent", "linkescape_bytes_received_total": "received",
                          "linkescape_link_up": "up", "linkescape_link_active": "active"}[name]] = v
    return out


def parse_snapshot(snaps: Any) -> Optional[Dict[str, Any]]:
    """The relay state in an endpoint's ``/snapshot`` (its first communicator, the world): per peer the rank
    it is relayed through (``via``) and the bytes sent through it in this relay, the pairs this rank passes
    on, and the bytes per ``peer:via`` ever sent through a relay. None when there is none."""
    if not isinstance(snaps, list):
        return None
    snap = next((x for x in snaps if isinstance(x, dict) and not x.get("comm")), None)
    if snap is None:
        return None
    via, now = {}, {}
    for peer, p in (snap.get("peers") or {}).items():
        if isinstance(p, dict) and p.get("via") is not None:
            via[int(peer)] = int(p["via"])
            now[int(peer)] = int(p.get("relay_bytes") or 0)
    return {"via": via, "relay_bytes": now, "relayed_pairs": snap.get("relayed_pairs"),
            "relay_bytes_total": {str(k): int(v) for k, v in (snap.get("relay_bytes") or {}).items()}}


def relays_from_metrics(m: Dict[str, Any], prev: Optional[Dict[str, Any]]) -> Dict[int, int]:
    """Without ``/snapshot``: a peer with no primary rail whose ``relay_bytes_total{peer,via}`` grew since the
    previous scrape is relayed through that ``via``."""
    out: Dict[int, int] = {}
    if prev is None:
        return out
    for key, n in m.get("relay_bytes_total", {}).items():
        peer, _, via = key.partition(":")
        if n > prev.get("relay_bytes_total", {}).get(key, 0) and m["primary"].get(int(peer), -1) == -1:
            out[int(peer)] = int(via)
    return out


class Poller:
    """Scrapes every target; rates come from the difference with the previous scrape."""

    def __init__(self, targets: Sequence[Target], timeout: float = 2.0, events: int = 12) -> None:
        extras.require(["prometheus_client"], "metrics", "linkescape status")
        self.targets = list(targets)
        self.timeout = timeout
        self.events = events
        self._prev: Dict[Target, Tuple[float, Dict[str, Any]]] = {}

    def poll(self) -> Dict[str, Any]:
        ranks, errors, events = [], {}, []
        for t in self.targets:
            try:
                now = time.monotonic()
                m = parse_metrics(fetch(t, "/metrics", self.timeout).decode())
            except (OSError, ValueError) as exc:
                errors[t.label] = str(exc)
                continue
            prev = self._prev.get(t)
            try:
                rel = parse_snapshot(json.loads(fetch(t, "/snapshot", self.timeout)))
            except (OSError, ValueError):
                rel = None
            if rel is not None:
                m["via"], m["relay_bytes"] = rel["via"], rel["relay_bytes"]
                if rel["relayed_pairs"] is not None:
                    m["relayed_pairs"] = rel["relayed_pairs"]
                m["relay_bytes_total"] = rel["relay_bytes_total"] or m["relay_bytes_total"]
            else:
                m["via"] = relays_from_metrics(m, prev[1] if prev else None)
            m["relay_source"] = "snapshot" if rel is not None else "metrics"
            for key, link in m["links"].items():
                if prev is not None and now > prev[0]:
                    old = prev[1]["links"].get(key, {})
                    dt = now - prev[0]
                    link["tx_rate"] = max(0.0, (link.get("sent", 0) - old.get("sent", 0)) / dt)
                    link["rx_rate"] = max(0.0, (link.get("received", 0) - old.get("received", 0)) / dt)
            self._prev[t] = (now, m)
            m["target"] = t.label
            ranks.append(m)
            try:
                evs = json.loads(fetch(t, f"/events?n={self.events}", self.timeout))
                events += [e for e in evs if not e.get("comm")]
            except (OSError, ValueError):
                pass
        ranks.sort(key=lambda m: (m["rank"] is None, m["rank"] or 0))
        events.sort(key=lambda e: e.get("ts") or 0.0)
        return {"ranks": ranks, "errors": errors, "events": events[-self.events:], "ts": time.time()}


def _rate(v: Optional[float]) -> str:
    if v is None:
        return "-"
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if v >= div:
            return f"{v / div:.1f} {unit}"
    return f"{v:.0f} B/s"


_STYLE = {"up": "green", "down": "bold white on red", "probing": "yellow", "connecting": "yellow"}


def render(view: Dict[str, Any]):
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    ranks = view["ranks"]
    nrails = max([1 + max(m["rails"] or {0: None}) for m in ranks] + [1 + k[1] for m in ranks for k in m["links"]]
                 + [1])
    t = Table(box=None, padding=(0, 1), show_edge=False)
    for col in ("rank", "peer"):
        t.add_column(col, justify="right", style="bold")
    for r in range(nrails):
        names = {m["rails"].get(r) for m in ranks if m["rails"].get(r)}
        t.add_column(f"rail {r}" + (f" ({names.pop()})" if len(names) == 1 else ""))
        t.add_column("tx / rx", justify="right")
    t.add_column("relay", justify="left")
    t.add_column("ops pending / oldest", justify="right")
    t.add_column("collective posted / done", justify="right")
    t.add_column("relaying for others", justify="right")
    for m in ranks:
        peers = sorted({k[0] for k in m["links"]})
        first = True
        for p in peers:
            row: List[Any] = [str(m["rank"]) if first else "", str(p)]
            for r in range(nrails):
                link = m["links"].get((p, r))
                if link is None:
                    row += ["", ""]
                    continue
                state = link.get("state") or ("up" if link.get("up") else "down")
                txt = Text(state, style=_STYLE.get(state, ""))
                if m["primary"].get(p) == r:
                    txt.append(" *primary", style="bold cyan")
                row += [txt, f"{_rate(link.get('tx_rate'))} / {_rate(link.get('rx_rate'))}"]
            via = (m.get("via") or {}).get(p)
            if m["lost"].get(p):
                row[1] = Text(f"{p} LOST", style="bold red")
            elif via is not None:
                row[1] = Text(f"{p} via {via}", style="bold cyan")
            elif m["no_path"].get(p):
                row[1] = Text(f"{p} no path {m['no_path'][p]:.1f}s", style="bold red")
            row.append(_relay_cell(m, p, via))
            oldest = m.get("oldest_op_s")
            row.append(f"{m.get('ops_pending')} / {oldest:.1f}s" if first and oldest is not None else "")
            c = m.get("collective") or {}
            row.append(f"#{c.get('posted')} / #{c.get('done')}" if first and c else "")
            pairs = m.get("relayed_pairs")
            row.append(Text(f"{pairs} pair{'s' if pairs != 1 else ''}", style="bold cyan" if pairs else "dim")
                       if first and pairs is not None else "")
            t.add_row(*row)
            first = False
    ev = Text()
    t0 = view.get("ts") or time.time()
    for e in view["events"]:
        ev.append(f"{time.strftime('%H:%M:%S', time.localtime(e.get('ts') or 0))} ({t0 - (e.get('ts') or t0):5.1f}s ago)  ",
                  style="dim")
        kind = e.get("event")
        style = "red" if kind in ("link_down", "no_path", "peer_lost") else (
            "cyan" if kind in ("relay_on", "relay_off") else "green")
        where = f"via {e.get('via')}" if kind in ("relay_on", "relay_off") else f"rail {e.get('rail')}"
        ev.append(f"rank {e.get('rank')} {kind} peer {e.get('peer')} {where} {e.get('cause') or ''}\n", style=style)
    parts: List[Any] = [t, Text(""), Panel(ev if view["events"] else Text("no link events", style="dim"),
                                           title="last events", title_align="left")]
    if view["errors"]:
        parts.append(Text("unreachable: " + "; ".join(f"{k} ({v})" for k, v in view["errors"].items()),
                          style="yellow"))
    return Panel(Group(*parts), title=f"linkescape status: {len(ranks)} ranks", border_style="blue")


def _bytes(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _relay_cell(m: Dict[str, Any], peer: int, via: Optional[int]):
    """"via R: bytes sent through R in this relay"; or what earlier relays to this peer carried (dim)."""
    from rich.text import Text

    if via is not None:
        now = (m.get("relay_bytes") or {}).get(peer)
        return Text(f"via {via}" + (f": {_bytes(now)}" if now is not None else ""), style="bold cyan")
    before = sum(n for k, n in (m.get("relay_bytes_total") or {}).items() if k.partition(":")[0] == str(peer))
    return Text(f"relayed {_bytes(before)} before", style="dim") if before else ""


def targets_of_testbed(name: Optional[str], port: int) -> List[Target]:
    """The metrics endpoints of a testbed's ranks (probed: ``P + host`` first, then ``P``)."""
    from ..testbed.netns import Testbed

    tb = Testbed.attach(name)
    out = []
    for i in range(tb.hosts):
        ns = tb.netns(i)
        found = None
        for p in dict.fromkeys((port + i, port)):
            t = Target("127.0.0.1", p, ns)
            try:
                fetch(t, "/healthz", 1.0)
                found = t
                break
            except OSError:
                continue
        out.append(found or Target("127.0.0.1", port + i, ns))
    return out


__all__ = ["Target", "parse_targets", "fetch", "parse_metrics", "parse_snapshot", "relays_from_metrics", "Poller",
           "render", "targets_of_testbed"]
