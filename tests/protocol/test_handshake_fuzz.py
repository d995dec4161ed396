"""Fuzzing the decoders that read bytes from strangers: the frame header and
the link handshake. They must raise only typed errors (ProtocolError,
HandshakeError), and no length field may make them hold more than the bound.

A fast mutation loop (seeds: every valid message, mutated in numpy batches by
bit flips, random bytes, interesting integers at random offsets, truncation,
extension, splicing and noise)
counts its inputs and prints the counts; hypothesis adds structure-aware
cases. ``make test`` runs ``FUZZ_INPUTS`` (default 1,000,000) per decoder
for the stateless decoders, a tenth of that through the stateful handshake
machines. The full count for those too::

    LINKESCAPE_FUZZ_INPUTS=1000000 LINKESCAPE_FUZZ_STATEFUL=1000000 \\
        .venv/bin/python -m pytest tests/protocol/test_handshake_fuzz.py -q -s
"""

from __future__ import annotations

import os
import random
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from linkescape.errors import AuthError, HandshakeError, ProtocolError
from linkescape.protocol import frames
from linkescape.protocol.frames import HEADER_SIZE, Kind, pack_header, unpack_header
from linkescape.protocol.handshake import (MAX_MESSAGE, REJECT, VERSION, AcceptorHandshake, DialerHandshake,
                                           Established, Msg, Proved, Reject, decode_messages)

FUZZ_INPUTS = int(os.environ.get("LINKESCAPE_FUZZ_INPUTS", "1000000"))
FUZZ_STATEFUL = int(os.environ.get("LINKESCAPE_FUZZ_STATEFUL", str(max(FUZZ_INPUTS // 10, 1000))))
BOUND = 1 << 20  # the configured max_frame_bytes of these runs
KEY = b"fuzz-key-" * 4
JOB = b"fedcba9876543210fedcba9876543210"
INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, BOUND, BOUND + 1, (1 << 31) - 1, 1 << 31,
               (1 << 32) - 1, 1 << 63, (1 << 64) - 1]


class Mutator:
    """Mutated copies of the seeds, made in batches with numpy (the decoders,
    not the mutation, should take the time): random bytes, bit flips,
    interesting integers at random offsets, truncation, extension, splicing
    and pure noise. Iterating yields ``bytes``."""

    BATCH = 1 << 14

    def __init__(self, seeds, seed: int) -> None:
        self.seeds = [bytes(s) for s in seeds]
        self.width = max(len(s) for s in self.seeds) + 64
        self.rng = np.random.default_rng(seed)
        self.table = np.zeros((len(self.seeds), self.width), np.uint8)
        for i, s in enumerate(self.seeds):
            self.table[i, :len(s)] = np.frombuffer(s, np.uint8)
        self.lens = np.array([len(s) for s in self.seeds])

    def batch(self):
        rng, n, w = self.rng, self.BATCH, self.width
        pick = rng.integers(0, len(self.seeds), n)
        buf = self.table[pick].copy()
        lens = self.lens[pick].copy()
        tail = rng.integers(0, 256, (n, w), dtype=np.uint8)
        rows = np.arange(n)
        for _ in range(2):  # random bytes and bit flips inside the seed
            at = (rng.random(n) * np.maximum(lens, 1)).astype(int)
            hit = rng.random(n) < 0.6
            buf[rows[hit], at[hit]] = rng.integers(0, 256, hit.sum(), dtype=np.uint8)
            at = (rng.random(n) * np.maximum(lens, 1)).astype(int)
            flip = rng.random(n) < 0.6
            buf[rows[flip], at[flip]] ^= (1 << rng.integers(0, 8, flip.sum())).astype(np.uint8)
        for width in (2, 4, 8):  # interesting integers in a field
            hit = rng.random(n) < 0.3
            at = (rng.random(n) * np.maximum(lens - width + 1, 1)).astype(int)
            values = np.array([v & ((1 << (8 * width)) - 1) for v in INTERESTING], np.uint64)
            chosen = values[rng.integers(0, len(values), n)]
            for j in range(width):
                buf[rows[hit], at[hit] + j] = ((chosen[hit] >> np.uint64(8 * j)) & np.uint64(0xFF)).astype(np.uint8)
        cut = rng.random(n)
        trunc = cut < 0.15
        lens[trunc] = (rng.random(trunc.sum()) * lens[trunc]).astype(int)
        ext = (cut >= 0.15) & (cut < 0.3)
        extra = rng.integers(1, 64, n)
        grown = np.minimum(lens + extra, w)
        buf[ext] = np.where(np.arange(w) < lens[ext, None], buf[ext], tail[ext])
        lens[ext] = grown[ext]
        splice = (cut >= 0.3) & (cut < 0.4)  # the tail of another seed after a cut
        other = self.table[rng.integers(0, len(self.seeds), n)]
        at = (rng.random(n) * np.maximum(lens, 1)).astype(int)
        shifted = np.where(np.arange(w) < at[:, None], buf, other)
        buf[splice] = shifted[splice]
        noise = cut >= 0.97
        buf[noise] = tail[noise]
        lens[noise] = rng.integers(0, w, noise.sum())
        return buf, lens

    def take(self, count: int):
        left = count
        while left > 0:
            buf, lens = self.batch()
            for i in range(min(left, len(lens))):
                yield buf[i, :lens[i]].tobytes()
            left -= len(lens)


def _header_seeds():
    out = []
    for kind in Kind:
        length = 4096 if kind == Kind.DATA else 88 if kind == Kind.RELAY else 0
        out.append(pack_header(kind, 1 if kind == Kind.DATA else 0, 7, msg=(1 << 63) | 3, offset=0,
                               length=length, sig=0xBEEF, arg=length or 1, flags=1))
    return out


def _transcript(nonce_d=bytes(32), nonce_a=bytes(32)):
    d = DialerHandshake(KEY, JOB, 2, 0, 1, 5, 17, 1e9, nonce=nonce_d)
    a = AcceptorHandshake(KEY, JOB, 0, 4, 2, 1e9, nonce=nonce_a)
    hello = d.data_to_send()
    a.receive_data(hello, 0.0)
    challenge = a.data_to_send()
    d.receive_data(challenge, 0.0)
    proof = d.data_to_send()
    a.receive_data(proof, 0.0)
    a.admit(9)
    accept = a.data_to_send()
    return hello, challenge, proof, accept


def _report(capsys, name, count, took):
    with capsys.disabled():
        print(f"\n  fuzz {name}: {count:,} inputs in {took:.1f}s ({count / max(took, 1e-9):,.0f}/s)", end="")


def test_fuzz_frame_header_decoder(capsys):
    mutate = Mutator(_header_seeds(), seed=1)
    ok = errors = 0
    t0 = time.perf_counter()
    for buf in mutate.take(FUZZ_INPUTS):
        try:
            h = unpack_header(buf, BOUND)
        except ProtocolError:
            errors += 1
            continue
        ok += 1
        assert h.kind in frames._KINDS
        if h.kind == Kind.RELAY:  # a whole frame of another pair (its end-to-end MAC, header, payload within the bound)
            least = frames.RELAY_TRAILER + frames.HEADER_SIZE
            assert least <= h.length <= BOUND + least
        else:
            assert h.length <= BOUND
            assert h.kind == Kind.DATA or h.length == 0
    _report(capsys, "frame header", ok + errors, time.perf_counter() - t0)
    assert ok + errors == FUZZ_INPUTS and ok and errors


def test_fuzz_handshake_decoder(capsys):
    hello, challenge, proof, accept = _transcript()
    reject = REJECT.pack(frames.MAGIC, VERSION, Msg.REJECT, Reject.BAD_PROOF, bytes(32))
    mutate = Mutator([hello, challenge, proof, accept, reject, hello + proof, challenge + accept], seed=2)
    ok = errors = 0
    t0 = time.perf_counter()
    for buf in mutate.take(FUZZ_INPUTS):
        try:
            msgs = decode_messages(buf)
        except HandshakeError:
            errors += 1
            continue
        ok += 1
        assert all(len(raw) <= MAX_MESSAGE for _, raw in msgs)
    _report(capsys, "handshake messages", ok + errors, time.perf_counter() - t0)
    assert ok + errors == FUZZ_INPUTS and ok and errors


def test_fuzz_acceptor_state_machine(capsys):
    """Mutated dialer transcripts, cut at random places, into fresh acceptors:
    only typed errors, nothing buffered past one message, and a dialer is
    proved only by the genuine bytes."""
    hello, challenge, proof, _ = _transcript()
    genuine = hello + proof
    mutate = Mutator([genuine, hello, hello + proof[:20], proof], seed=3)
    rng = random.Random(4)
    proved = failed = partial = 0
    t0 = time.perf_counter()
    for data in mutate.take(FUZZ_STATEFUL):
        a = AcceptorHandshake(KEY, JOB, 0, 4, 2, 1e9, nonce=bytes(32))
        try:
            pos = 0
            event = None
            while pos < len(data):
                step = rng.randrange(1, 80)
                event = a.receive_data(data[pos:pos + step], 0.0) or event
                assert len(a.reader.buf) <= MAX_MESSAGE
                pos += step
        except HandshakeError:
            failed += 1
            continue
        if isinstance(event, Proved):
            assert data == genuine
            proved += 1
        else:
            partial += 1
    _report(capsys, "acceptor machine", proved + failed + partial, time.perf_counter() - t0)
    assert failed and partial


def test_fuzz_dialer_state_machine(capsys):
    _, challenge, _, accept = _transcript()
    genuine = challenge + accept
    reject = REJECT.pack(frames.MAGIC, VERSION, Msg.REJECT, Reject.BAD_PROOF, bytes(32))
    mutate = Mutator([genuine, challenge, challenge + reject, reject], seed=5)
    done = failed = partial = 0
    t0 = time.perf_counter()
    for data in mutate.take(FUZZ_STATEFUL):
        d = DialerHandshake(KEY, JOB, 2, 0, 1, 5, 17, 1e9, nonce=bytes(32))
        d.data_to_send()
        try:
            event = d.receive_data(data, 0.0)
        except HandshakeError:
            failed += 1
            continue
        if isinstance(event, Established):
            assert data == genuine
            done += 1
        else:
            partial += 1
    _report(capsys, "dialer machine", done + failed + partial, time.perf_counter() - t0)
    assert failed and partial


def test_no_length_field_makes_the_decoders_allocate():
    """Headers and handshakes with every length-ish field at its largest:
    decoding holds no more memory than a few small objects."""
    mutate = Mutator(_header_seeds() + list(_transcript()), seed=6)
    inputs = list(mutate.take(5000))
    huge = [pack_header(Kind.DATA, 1, 0, length=(1 << 32) - 1, arg=(1 << 32) - 1),
            pack_header(Kind.DATA, 1, 0, length=BOUND + 1, arg=BOUND + 1)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for buf in inputs + huge:
            for fn in (lambda b: unpack_header(b, BOUND), decode_messages):
                try:
                    fn(buf)
                except (ProtocolError, HandshakeError):
                    pass
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, peak
    for buf in huge:
        with pytest.raises(ProtocolError):
            unpack_header(buf, BOUND)


@settings(max_examples=300, deadline=None)
@given(kind=st.integers(0, 255), flags=st.integers(0, 255), sig=st.integers(0, (1 << 32) - 1),
       seq=st.integers(0, (1 << 64) - 1), ack=st.integers(0, (1 << 64) - 1), msg=st.integers(0, (1 << 64) - 1),
       offset=st.integers(0, (1 << 64) - 1), length=st.integers(0, (1 << 32) - 1),
       arg=st.integers(0, (1 << 32) - 1), cut=st.integers(0, HEADER_SIZE))
def test_hypothesis_frame_header(kind, flags, sig, seq, ack, msg, offset, length, arg, cut):
    raw = frames.HEADER.pack(kind, flags, 0, sig, seq, ack, msg, offset, length, arg)[:cut or HEADER_SIZE]
    try:
        h = unpack_header(raw, BOUND)
    except ProtocolError:
        return
    assert (h.kind, h.seq, h.ack, h.length) == (kind, seq, ack, length) and length <= BOUND


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3 * MAX_MESSAGE), prefix=st.sampled_from([b"", *(_transcript()[:1])]))
def test_hypothesis_handshake(data, prefix):
    a = AcceptorHandshake(KEY, JOB, 0, 4, 2, 1e9)
    try:
        a.receive_data(prefix + data, 0.0)
    except (HandshakeError, AuthError):
        pass
    try:
        decode_messages(prefix + data)
    except HandshakeError:
        pass
