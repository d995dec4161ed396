from __future__ import annotations

import pytest

from linkescape.errors import HandshakeError, ProtocolError
from linkescape.protocol.frames import HEADER_SIZE, Hello, Kind, pack_header, unpack_header
from linkescape.protocol.linkstate import Ev, LinkStatus, PathPolicy, State, TransitionError


def test_header_roundtrip_and_size():
    raw = pack_header(Kind.DATA, seq=7, ack=3, msg=(1 << 63) | 5, offset=4096, length=100, sig=0xABC, arg=9999, flags=1)
    assert len(raw) == HEADER_SIZE == 48
    h = unpack_header(raw)
    assert (h.kind, h.seq, h.ack, h.msg, h.offset, h.length, h.sig, h.arg, h.flags) == \
        (Kind.DATA, 7, 3, (1 << 63) | 5, 4096, 100, 0xABC, 9999, 1)


def test_a_data_frame_that_does_not_fit_its_message_is_a_protocol_error():
    """Issue 48: the first frame of a message is matched by its size alone; one
    longer than its message must cost its link, never be placed."""
    for offset, length, arg in ((0, 16, 8), (4096, 100, 4195), (1 << 63, 1, 1 << 32 - 1)):
        with pytest.raises(ProtocolError, match="message"):
            unpack_header(pack_header(Kind.DATA, 1, 0, 5, offset, length, 0, arg=arg))
    assert unpack_header(pack_header(Kind.DATA, 1, 0, 5, 4096, 100, 0, arg=4196)).length == 100


def test_bad_frames_are_protocol_errors():
    with pytest.raises(ProtocolError):
        unpack_header(bytes([99]) + bytes(47))
    with pytest.raises(ProtocolError):
        unpack_header(pack_header(Kind.ACK, 0, 1, length=5))


def test_hello_checks_magic_version_job_ranks_rail():
    h = Hello(src=2, dst=0, rail=1, epoch=3, expected=1, job=b"job-a")
    back = Hello.unpack(h.pack())
    assert back == h
    back.check(job=b"job-a", dst=0, world_size=4, rails=2)
    with pytest.raises(HandshakeError):
        back.check(job=b"job-b", dst=0, world_size=4, rails=2)
    with pytest.raises(HandshakeError):
        back.check(job=b"job-a", dst=1, world_size=4, rails=2)
    with pytest.raises(HandshakeError):
        back.check(job=b"job-a", dst=0, world_size=4, rails=1)
    with pytest.raises(HandshakeError):
        Hello.unpack(b"GET / HTTP/1.1\r\n" + bytes(len(h.pack()) - 16))
    raw = bytearray(h.pack())
    raw[4] = 9  # version
    with pytest.raises(HandshakeError):
        Hello.unpack(bytes(raw))


def test_link_state_table():
    l = LinkStatus(rail=0)
    assert l.apply(Ev.CONNECTED, 0.0) and l.state is State.UP
    assert l.apply(Ev.CARRIER_DOWN, 1.0) and l.state is State.DOWN and l.failures == 1
    assert not l.apply(Ev.TIMEOUT, 1.1)  # already down: ignored on purpose
    assert l.apply(Ev.PROBE, 1.2) and l.state is State.PROBING
    assert l.apply(Ev.PROBE_FAILED, 1.3) and l.state is State.DOWN
    first = l.backoff
    l.apply(Ev.PROBE, 1.4)
    l.apply(Ev.PROBE_FAILED, 1.5)
    assert l.backoff == min(first * 2, 1.0)
    l.apply(Ev.PROBE, 2.0)
    assert l.apply(Ev.CONNECTED, 2.1) and l.up_since == 2.1
    with pytest.raises(TransitionError):
        LinkStatus(rail=0, state=State.CONNECTING).apply(Ev.PROBE_FAILED, 0.0)


def test_backoff_is_capped():
    l = LinkStatus(rail=0)
    l.apply(Ev.CONNECTED, 0)
    l.apply(Ev.SOCKET_ERROR, 0)
    for i in range(20):
        l.apply(Ev.PROBE, i)
        l.apply(Ev.PROBE_FAILED, i)
    assert l.backoff == 1.0


def test_policy_fails_over_and_back_after_holddown():
    links = [LinkStatus(rail=0), LinkStatus(rail=1)]
    for l in links:
        l.apply(Ev.CONNECTED, 0.0)
    p = PathPolicy(primary=0, holddown=1.0)
    assert p.choose(links, 0.0) == [0]
    links[0].apply(Ev.CARRIER_DOWN, 5.0)
    assert p.choose(links, 5.0) == [1]
    links[0].apply(Ev.PROBE, 5.1)
    links[0].apply(Ev.CONNECTED, 5.2)
    assert p.choose(links, 5.5) == [1]  # hold-down: a flapping rail must not pull traffic back
    assert p.choose(links, 6.3) == [0]
    links[1].apply(Ev.TIMEOUT, 7.0)
    links[0].apply(Ev.TIMEOUT, 7.0)
    assert p.choose(links, 7.0) == []


def test_policy_uses_recovering_primary_as_last_resort_and_stripes():
    links = [LinkStatus(rail=0), LinkStatus(rail=1)]
    for l in links:
        l.apply(Ev.CONNECTED, 0.0)
    links[0].apply(Ev.CARRIER_DOWN, 1.0)
    links[0].apply(Ev.CONNECTED, 1.5)
    links[1].apply(Ev.CARRIER_DOWN, 1.6)
    assert PathPolicy(holddown=1.0).choose(links, 1.7) == [0]
    both = [LinkStatus(rail=0), LinkStatus(rail=1)]
    for l in both:
        l.apply(Ev.CONNECTED, 0.0)
    assert PathPolicy(stripe=True).choose(both, 0.0) == [0, 1]
