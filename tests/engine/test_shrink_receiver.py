"""What a failed operation or a shrink leaves behind in a peer's receiver and in the relay
(review of issue 47's shrink): a message the sender dropped half sent never blocks the next one,
the old group's unexpected messages go on quiet peers too, and an excluded rank's relayed frames
free the relay's room. A PeerChannel over socket pairs and a fake clock (tests/engine/
test_peer_outcomes.py's rig); the loopback group: tests/integration/test_shrink_integ.py."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from linkescape.engine.membership import shrink_locked
from linkescape.engine.messages import EPOCH_SHIFT, InMessage, Op
from linkescape.engine.outcomes import Emit, Fatal, RecvDone
from linkescape.errors import GroupShrunk
from linkescape.protocol.frames import DATA, P2P_FLAG, pack_header
from linkescape.testing import raise_first, run_ranks

from test_peer_outcomes import Rig, _sealed


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def _recv(rig, msg: int, nbytes: int, collective: bool = True):
    op = Op(msg, "t", 1e9, collective=collective)
    buf = bytearray(nbytes)
    m = InMessage(op, 1, msg, 0, nbytes, dst=memoryview(buf))
    op.recvs.append(m)
    op.pending_recvs = 1
    if collective:
        rig.matcher.coll_started = msg
    rig.peer.post_recv(m)
    return m, buf


def _data(seq: int, msg: int, offset: int, payload: bytes, nbytes: int, sig: int = 0) -> bytes:
    return pack_header(DATA, seq, 0, msg=msg, offset=offset, length=len(payload), sig=sig, arg=nbytes) + payload


def _broken(out) -> list:
    return [o for o in out if isinstance(o, Fatal) or (isinstance(o, Emit) and o.event == "link_down")]


def _deliver(rig, how: str, frame: bytes) -> list:
    if how == "link":
        return rig.send(0, frame)
    return list(rig.peer.on_relayed(_sealed(frame)))  # (a relayed frame: Receiver._whole_data)


@pytest.mark.parametrize("how", ["link", "relayed"])
def test_a_message_both_sides_dropped_half_way_gives_way_to_the_next(rig, how):
    """Both sides' operation failed (a timeout, a shrink) with a message half in: the sender drops
    the rest (Sender.cancel), the receiver waits for it (Dropped). The next message's first frame
    proves the rest never comes: it is taken, not a protocol error on every rail (the group dead)."""
    m, _ = _recv(rig, 1, 8)
    assert not _broken(_deliver(rig, how, _data(1, 1, 0, b"abcd", 8)))
    rig.peer.receiver.cancel(m)
    rig.matcher.failed(1)
    m2, buf = _recv(rig, 2, 4)
    out = _deliver(rig, how, _data(2, 2, 0, b"wxyz", 4))
    assert not _broken(out)
    assert RecvDone(m2) in out and bytes(buf) == b"wxyz"
    assert all(link.open for link in rig.links.values())


def test_the_rest_of_a_dropped_message_still_in_the_replay_window_is_read_and_dropped(rig):
    """Frames the sender carved before its operation failed still come (its replay window): they
    go to the Dropped message, and the next message after them is taken."""
    m, _ = _recv(rig, 1, 12)
    rig.send(0, _data(1, 1, 0, b"abcd", 12))
    rig.peer.receiver.cancel(m)
    m2, buf = _recv(rig, 2, 4)
    out = rig.send(0, _data(2, 1, 4, b"efgh", 12), _data(3, 2, 0, b"wxyz", 4))
    assert not _broken(out) and RecvDone(m2) in out and bytes(buf) == b"wxyz"


def test_a_half_unexpected_p2p_message_the_sender_dropped_gives_way_to_the_next(rig):
    tag = P2P_FLAG | 7
    rig.send(0, _data(1, tag, 0, b"abcd", 8))
    receiver = rig.peer.receiver
    assert receiver.unexpected_count == 1 and rig.matcher.holding == {rig.peer.receiver}
    out = rig.send(0, _data(2, tag, 0, b"wxyz", 4))  # the send after it (the first one's op failed)
    assert not _broken(out)
    assert receiver.unexpected_count == 1 and receiver.unexpected_bytes == 4
    m, buf = _recv(rig, tag, 4, collective=False)
    assert bytes(buf) == b"wxyz" and m.done
    assert receiver.unexpected_count == 0 and not rig.matcher.holding


def test_a_newer_groups_frame_waits_while_a_receive_is_half_in_until_this_rank_shrank(rig):
    """The sender shrank first (its half-sent message dropped): its new group's frame waits (the
    link parks) rather than break the link; our shrink ends the receive and the frame goes on."""
    m, _ = _recv(rig, 1, 8)
    rig.send(0, _data(1, 1, 0, b"abcd", 8))
    first = (1 << EPOCH_SHIFT) + 1
    out = rig.send(0, _data(2, first, 0, b"wxyz", 4))
    assert not _broken(out) and rig.links[0].parked
    rig.peer.receiver.cancel(m)  # (our shrink: the operation fails, then the new epoch)
    rig.matcher.new_epoch(1)
    m2, buf = _recv(rig, first, 4)
    out = list(rig.peer.resume())
    assert not _broken(out) and RecvDone(m2) in out and bytes(buf) == b"wxyz"


class _Ops:
    def __len__(self):
        return 0

    def fail_all(self, exc):
        pass


def _engine(rig, *, hot=()):
    """What shrink_locked looks at, around the rig's one peer (rank 1) and relay router."""
    engine = SimpleNamespace(
        ops=_Ops(), excluded=set(), expired={}, fatal=None, matcher=rig.matcher, hot=set(hot), world_size=4, rank=0,
        nrails=len(rig.links), config=rig.config, relays=rig.relays, down=set(), rail_word=rig.rail_word,
        degraded_watch=set(), _relay_search={}, _probe_wanted=set(), _probed=None, probes=None,
        liveness=SimpleNamespace(forget=lambda rank: None), peers=SimpleNamespace(find=rig.peers.get))
    engine._apply = lambda peer, outcomes: list(outcomes)
    engine._resume_unblocked = lambda: [engine.relays.take_unblocked()]
    return engine


def test_a_shrink_drops_the_old_groups_unexpected_messages_of_a_quiet_peer(rig):
    tag = P2P_FLAG | 3
    rig.send(0, _data(1, tag, 0, b"abcd", 4, sig=0))
    receiver = rig.peer.receiver
    assert receiver.unexpected_count == 1
    shrink_locked(_engine(rig), [3], 1)  # rank 1 is quiet: not in engine.hot
    assert receiver.unexpected_count == 0 and receiver.unexpected_bytes == 0 and not receiver.unexpected
    assert not rig.matcher.holding


def test_excluding_a_rank_frees_the_relay_room_its_queued_frames_held(rig):
    """Frames of rank 5 we relay to rank 1, queued on rank 1's link (its socket full): rank 1 is
    left out. They are never written: the relay's room for rank 5 is free again, so its parked
    links read on (before: held forever, rank 5 blocked forever)."""
    link = rig.links[0]
    link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    rig.peer.paths.active = [0]
    relays = rig.relays
    frame = memoryview(bytearray(4 << 20))
    assert relays.forward(5, 1, frame) is link
    assert relays.held_total == len(frame)
    relays.blocked.add(5)
    shrink_locked(_engine(rig), [1], 1)
    assert relays.held_total == 0 and not relays.held and not relays.held_by_src
    assert 5 not in relays.blocked


def _post_after_shrink_closed(comm):
    if comm.rank == 1:
        time.sleep(3)
        return None
    comm.set_timeout(5.0)
    got = {}

    def post():
        started = time.monotonic()
        try:
            comm.all_reduce(np.ones(4, np.float32))
            got["error"] = None
        except Exception as exc:  # noqa: BLE001 (what it raised is the test's point)
            got["error"] = type(exc).__name__
        got["after"] = time.monotonic() - started

    with comm._post_lock:  # as shrink holds it: the thread passed _check_open and waits here
        t = threading.Thread(target=post)
        t.start()
        time.sleep(0.3)
        comm._closed = True
        comm._closed_error = GroupShrunk("the group was shrunk (test)", excluded=[1])
    t.join(10)
    return got


def test_a_thread_waiting_for_the_post_lock_while_the_group_is_shrunk_never_posts_on_it():
    out = raise_first(run_ranks(2, _post_after_shrink_closed, timeout=60))
    assert out[0]["error"] == "GroupShrunk" and out[0]["after"] < 2.0, out[0]
