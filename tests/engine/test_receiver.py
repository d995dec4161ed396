"""engine/receiver.Receiver on its own (no PeerChannel around it): it returns what it read, in the
order read, and never calls into its peer. A control frame, or a frame whose rail word changed,
ends a read loop: what follows on the link is read only once the caller applied it (and calls
again)."""

from __future__ import annotations

import ast
import pathlib
import socket

import pytest

from linkescape.engine.link import Link
from linkescape.engine.messages import InMessage, Op
from linkescape.engine.outcomes import RecvDone
from linkescape.engine.receiver import Heard, Receiver
from linkescape.protocol.channel import RecvChannel, SendChannel
from linkescape.protocol.frames import DATA, HEARTBEAT, NOTIFY_UP, pack_header
from linkescape.protocol.linkstate import PathPolicy
from linkescape.protocol.paths import PeerPaths

from test_peer_outcomes import Rig

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "linkescape" / "engine" / "receiver.py"


@pytest.fixture
def parts():
    rig = Rig(nrails=1)
    a, b = socket.socketpair()
    a.setblocking(False)
    link = Link(a, 1, 0, 1, rig.clock.now())
    links = [link]
    paths = PeerPaths(0, 1, 1, PathPolicy(primary=0, holddown=1.0))
    receiver = Receiver(1, rig.env, links, RecvChannel(), SendChannel(), paths)
    yield rig, receiver, link, b, paths
    a.close()
    b.close()
    rig.close()


def _read(receiver, link):
    """One call: what it returned (None: the socket had nothing more)."""
    try:
        return receiver.on_readable(link)
    except BlockingIOError:
        return None


def _post(rig, receiver, nbytes: int) -> InMessage:
    """A collective's receive of ``nbytes`` from rank 1 (message 1)."""
    op = Op(1, "t", 1e9, collective=True)
    m = InMessage(op, 1, 1, 0, nbytes, dst=memoryview(bytearray(nbytes)))
    op.recvs.append(m)
    op.pending_recvs = 1
    rig.matcher.coll_started = 1
    receiver.post(m)
    return m


def _data(seq: int, offset: int, payload: bytes, nbytes: int, rails: int = 0) -> bytes:
    return pack_header(DATA, seq, 0, msg=1, offset=offset, length=len(payload), arg=nbytes, rails=rails) + payload


def test_a_control_frame_is_returned_and_what_follows_waits_for_the_next_call(parts):
    rig, receiver, link, remote, paths = parts
    m = _post(rig, receiver, 4)
    beat = pack_header(HEARTBEAT, 0, 0, arg=5)
    remote.sendall(beat + pack_header(NOTIFY_UP, 0, 0, arg=0) + _data(1, 0, b"abcd", 4))
    assert _read(receiver, link) is True
    assert [(type(x), x.hdr.kind, x.hdr.arg) for x in receiver.out] == [(Heard, HEARTBEAT, 5)]
    assert receiver.inbound.expected == 1 and not m.done  # the DATA frame behind it: not read yet
    receiver.out.clear()
    assert _read(receiver, link) is True
    assert [x.hdr.kind for x in receiver.out] == [NOTIFY_UP]
    receiver.out.clear()
    assert _read(receiver, link) in (False, None)
    assert receiver.out == [RecvDone(m)] and bytes(m.dst) == b"abcd"


def test_a_frame_whose_rail_word_changed_is_applied_and_the_loop_ends_after_it(parts):
    rig, receiver, link, remote, paths = parts
    m = _post(rig, receiver, 8)
    word = (1 << 8) | 1  # the peer's rail 0 without carrier, generation 1
    remote.sendall(_data(1, 0, b"abcd", 8, rails=word) + _data(2, 4, b"efgh", 8, rails=word))
    assert _read(receiver, link) is True
    heard = [x for x in receiver.out if isinstance(x, Heard)]
    assert [x.hdr.rails for x in heard] == [word] and heard[0].link is link
    assert receiver.inbound.expected == 2  # that frame went in: its bytes are the pair's, whatever the word
    receiver.out.clear()
    paths.peer_word(word, rig.clock.now(), 0)  # (the shell applied it)
    assert _read(receiver, link) in (False, None)  # the same word again: nothing for the paths
    assert receiver.out == [RecvDone(m)] and bytes(m.dst) == b"abcdefgh"


def test_a_duplicate_asks_for_an_ack_through_a_flag_not_through_the_sender(parts):
    rig, receiver, link, remote, paths = parts
    _post(rig, receiver, 4)
    frame = _data(1, 0, b"abcd", 4)
    remote.sendall(frame + frame)
    _read(receiver, link)
    assert receiver.want_ack and receiver.inbound.expected == 2


def test_the_receiver_never_reaches_into_its_peer():
    """Its source names no ``peer`` object: it is built from the pair's parts (links, channels,
    the paths read only, the environment) and what it read goes back in ``out``."""
    tree = ast.parse(SRC.read_text())
    reach = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Attribute) and node.value.attr == "peer"]
    names = [node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "peer"]
    assert reach == [] and names == []
