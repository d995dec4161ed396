"""Everything the engine keeps about one peer: its channel, links and queues."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional

from ..protocol.channel import RecvChannel, SendChannel
from ..protocol.linkstate import LinkStatus, State
from .link import Link
from .messages import InMessage, OutMessage


class Unexpected:
    """A point-to-point message that arrived before its receive was posted."""

    __slots__ = ("msg", "sig", "nbytes", "received", "buf", "done")

    def __init__(self, msg: int, sig: int, nbytes: int) -> None:
        self.msg = msg
        self.sig = sig
        self.nbytes = nbytes
        self.received = 0
        self.buf = memoryview(bytearray(nbytes))
        self.done = False


class Peer:
    def __init__(self, rank: int, nrails: int) -> None:
        self.rank = rank
        self.send = SendChannel()
        self.recv = RecvChannel()
        self.links: List[Optional[Link]] = [None] * nrails
        self.status: List[LinkStatus] = [LinkStatus(rail=r) for r in range(nrails)]
        self.sendq: Deque[OutMessage] = collections.deque()
        self.coll_recvs: Deque[InMessage] = collections.deque()
        self.p2p_recvs: Dict[int, Deque[InMessage]] = {}
        self.unexpected: Dict[int, Deque[Unexpected]] = {}
        #: the message whose frames are arriving now (frames of a message are contiguous)
        self.cur_in = None
        #: every unacknowledged frame must be queued again (after a failover)
        self.replay = False
        self.active: List[int] = []
        self.ack_urgent = False
        self.no_path_since: Optional[float] = None
        self.closed_by_peer = False
        #: when the last link ended with FIN/RST (a dead process, or a peer
        #: that dropped links it believed dead and will re-dial)
        self.eof_since: Optional[float] = None
        #: rails on which re-dialing was refused (nobody listening)
        self.refused: set = set()
        self.lost: Optional[BaseException] = None
        #: when each rail's NIC on the peer's side lost carrier (peer told us)
        self.peer_carrier_down: Dict[int, bool] = {}
        #: bytes moved by this peer's links that are closed now, per rail
        self.closed_sent: List[int] = [0] * nrails
        self.closed_received: List[int] = [0] * nrails

    def rail_bytes(self, rail: int) -> tuple:
        """(sent, received) on ``rail`` over every link ever opened to this peer."""
        link = self.links[rail]
        sent, received = self.closed_sent[rail], self.closed_received[rail]
        if link is not None:
            sent += link.bytes_sent
            received += link.bytes_received
        return sent, received

    def live_links(self) -> List[Link]:
        return [l for l in self.links if l is not None and l.status.state is State.UP]

