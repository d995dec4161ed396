"""Closing the engine: what the peers are told."""

from __future__ import annotations

import socket

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.core import Engine
from linkescape.engine.link import Link
from linkescape.protocol.frames import BYE
from linkescape.testing import frame_headers


def _kinds(sock) -> list:
    sock.settimeout(2.0)
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return [h.kind for h in frame_headers(data)]


def test_a_link_opened_but_not_yet_adopted_gets_a_bye_when_the_engine_closes():
    """A rank that closes right after start-up: recovery finished dialing a backup and handed it over
    (``call_soon``), and no progress round took it in before ``close()``. The peer adopted its end: a
    close without BYE read there as a reset, then every rail refused, and it failed with PeerLost."""
    eng = Engine(0, 2, 1, Config(), clock=FakeClock())
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        link = Link(ours, 1, 0, 1, eng.clock.now())
        eng.call_soon(lambda: eng.adopt(link, 1))
        theirs.shutdown(socket.SHUT_WR)  # the peer's EOF comes at once: the goodbye does not wait
        eng.close_locked(graceful=True, drain=0.1)
        assert BYE in _kinds(theirs)
    finally:
        eng.close_io()
        theirs.close()
