"""Grey failure, per rail: the goodput samples of the hot peers' links, judged
against their rail's reference and their rail's total (so a link that only
shares a healthy NIC is not grey), and the cleanliness of held links. The
engine's timers call it every GREY_INTERVAL (engine/core.py) while a link
carries bulk; the verdicts are the peers' (``hold_sample``, ``degraded``).

Costs: one TCP_INFO read per link that carried bytes since its last sample,
of hot peers only; nothing for idle links (O(hot links), never O(N))."""

from __future__ import annotations

from typing import Callable, Dict, Iterable

from ..protocol.grey import RailRate, Window
from ..protocol.linkstate import State
from ..transport.tcp import tcp_sample

#: a link busy for part of its window that moved this much in a sample carries bulk
GREY_BULK = 64 << 10


def sample_grey(hot: Iterable, rail_rates: "list[RailRate]", now: float, apply: Callable) -> bool:
    """Every busy link's goodput window, judged against its rail's reference and total; held
    links' cleanliness. ``apply(peer, outcomes)`` applies a peer's verdicts. True when a link was
    held or busy (data outstanding) for part of its window."""
    windows: Dict[int, list] = {}
    judged = []
    busy = False
    for peer in tuple(hot):  # a link that carried bytes belongs to a hot peer
        for link in peer.links:
            if link is None or peer.status[link.rail].state is not State.UP or link.grey is None:
                continue
            held = peer.avoid >> link.rail & 1
            if not held and link.bytes_sent == link.grey_sent:
                continue  # it carried nothing since the last sample: nothing to judge
            link.grey_sent = link.bytes_sent
            try:
                sample = tcp_sample(link.sock, now)
            except OSError:
                continue
            w = link.grey.measure(sample)
            if held:
                busy = True
                apply(peer, peer.hold_sample(link, now, sample.retrans_segs, sample.data_segs))
            elif w is not None:
                busy = busy or (w.busy >= link.grey.min_busy * w.dt and w.sent >= GREY_BULK)
                windows.setdefault(link.rail, []).append(w)
                judged.append((peer, link, w))
    for rail, ws in windows.items():
        rail_rates[rail].observe(Window.total(ws))
    for peer, link, w in judged:
        if (peer.links[link.rail] is link and link.grey.judge(w, now)
                and peer.other_clean_rail(link.rail)):
            apply(peer, peer.degraded(link))
    return busy


__all__ = ["GREY_BULK", "sample_grey"]
