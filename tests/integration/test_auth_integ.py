"""Authenticated links on live communicators (loopback rails, real sockets).

An attacker here is a process that can read the store (the job token, every
rank's addresses, even the per-job secret) but does not hold the job's key.
It must get no link and change nothing: every collective stays exact, no link
goes down, and every connection it makes is closed and counted.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import struct
import time

import numpy as np
import pytest

from linkescape import AuthError, Communicator, Config, FileStore
from linkescape.protocol.frames import Kind, pack_header
from linkescape.protocol.handshake import (CHALLENGE, MAGIC, PROOF, VERSION, Hello, Msg, decode_messages, hello_mac,
                                           proof)
from linkescape.rendezvous import KEY_ADDR, KEY_JOB, KEY_SECRET
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")
KEY = "integration-test-key-" + "x" * 16
CFG = Config(timeout=60, connect_timeout=60, auth_key=KEY, failback_holddown=0.3)
DONE_KEY = "test/attack-done"

FORGED = {  # one frame of every kind, each chosen to do harm if it were believed
    Kind.DATA: pack_header(Kind.DATA, 1, 0, msg=1, offset=0, length=8, arg=8) + b"\xff" * 8,
    Kind.ACK: pack_header(Kind.ACK, 0, (1 << 64) - 1),  # "everything you ever send is acked"
    Kind.HEARTBEAT: pack_header(Kind.HEARTBEAT, 0, (1 << 64) - 1),
    Kind.NOTIFY_DOWN: pack_header(Kind.NOTIFY_DOWN, 0, 0, arg=0),
    Kind.NOTIFY_UP: pack_header(Kind.NOTIFY_UP, 0, 0, arg=0),
    Kind.BYE: pack_header(Kind.BYE, 0, 0, arg=(1 << 32) - 1),
    Kind.NOTIFY_SILENT: pack_header(Kind.NOTIFY_SILENT, 0, 0, arg=1),
}
for _kind in Kind:  # kinds added later are forged too: a control frame naming rank/rail 0, acking everything
    FORGED.setdefault(_kind, pack_header(_kind, 0, (1 << 64) - 1, arg=0))


# ----------------------------------------------------------------- helpers
def _text(v):
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _store_view(store, n):
    """What a store reader learns: the job, the secret, every address."""
    job = _text(store.get(KEY_JOB)).encode()
    secret = _text(store.get(KEY_SECRET.format(job=job.decode()))).encode()
    records = {r: json.loads(_text(store.get(KEY_ADDR.format(rank=r)))) for r in range(n)}
    addrs = {r: [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in rec["rails"]] for r, rec in records.items()}
    return job, secret, addrs


def _read_until_closed(sock, timeout=10.0):
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return out, True
        except socket.timeout:
            return out, False
        if not chunk:
            return out, True
        out += chunk


def _send(sock, data):
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _worker(rank, n, store_dir, config, steps_min=3):
    """A rank: collectives with exact results until the attacker is done
    (decided together, so that every rank runs the same collectives)."""
    store = FileStore(store_dir, timeout=60)
    with Communicator(store, rank, n, rails=RAILS, config=config) as comm:
        store.set(f"test/ready/{rank}", "1")
        steps = wrong = 0
        while True:
            buf = np.full(4096, rank + 1 + steps, np.float32)
            comm.all_reduce(buf)
            want = sum(r + 1 + steps for r in range(n))
            wrong += int(not np.all(buf == want))
            big = np.arange(300_000, dtype=np.float64) * (rank + 1)
            comm.all_reduce(big)
            wrong += int(not np.array_equal(big, np.arange(300_000, dtype=np.float64) * (n * (n + 1) // 2)))
            steps += 1
            done = np.array([1 if store.check([DONE_KEY]) and steps >= steps_min else 0], np.int32)
            comm.all_reduce(done)  # SUM: stop only when every rank saw the attacker finish
            if done[0] == n:
                break
        comm.barrier()
        snap = comm.snapshot()
        events = [(e["event"], e.get("cause"), e.get("peer"), e.get("rail")) for e in comm.events.recent()]
        links = [(p, l["rail"], l["state"], l["usable"], l["failures"])
                 for p, info in snap["peers"].items() for l in info["links"]]
        return {"wrong": wrong, "steps": steps, "events": events, "links": links,
                "rejected": snap["rejected_connections"]}


def _wait_ready(store, n, timeout=60):
    deadline = time.monotonic() + timeout
    while not store.check([f"test/ready/{r}" for r in range(n)]):
        assert time.monotonic() < deadline, "ranks never came up"
        time.sleep(0.01)


def _assert_undisturbed(results, n, min_rejected):
    for rank, res in enumerate(results[:n]):
        assert res["wrong"] == 0, (rank, res)
        assert res["events"] == [], (rank, res["events"])  # no link ever went down, nothing failed over
        for peer, rail, state, usable, failures in res["links"]:
            assert state == "up" and failures == 0, (rank, res["links"], res["events"])
        assert res["rejected"] >= min_rejected[rank], (rank, res["rejected"], min_rejected[rank])


# ----------------------------------------------------------------- forged frames
def _forger(n, store_dir):
    """Store access, no key: for every rank, rail and frame kind, claim to be
    another rank with a high epoch, prove with the best a store reader has
    (the per-job secret), then send the forged frame."""
    store = FileStore(store_dir, timeout=60)
    _wait_ready(store, n)
    job, secret, addrs = _store_view(store, n)
    report = []
    for kind, frame in FORGED.items():
        for r in range(n):
            claimed = n - 1 if r < n - 1 else 0  # a real rank that may dial r (or, for the top rank, one that may not)
            for rail, addr in enumerate(addrs[r]):
                for style in ("secret", "random", "v1", "raw"):
                    s = socket.create_connection(addr, timeout=10)
                    nonce = secrets.token_bytes(32)
                    hello = Hello(claimed, r, rail, 1 << 30, 1 << 40, job, nonce)
                    # the HELLO's own MAC: with the per-job secret (the best a store reader has), or random
                    hello = Hello(claimed, r, rail, 1 << 30, 1 << 40, job, nonce,
                                  mac=hello_mac(secret, hello) if style == "secret" else secrets.token_bytes(32))
                    if style == "raw":
                        _send(s, frame)
                    elif style == "v1":  # the handshake of old: a Hello answered by a Hello
                        _send(s, Hello(claimed, r, rail, 1 << 30, 1, job, nonce, version=1).pack()[:88] + frame)
                    else:
                        _send(s, hello.pack())
                        s.settimeout(10)
                        try:
                            got = s.recv(CHALLENGE.size)
                        except OSError:
                            got = b""
                        if len(got) == CHALLENGE.size:
                            nonce_a = CHALLENGE.unpack(got)[3]
                            mac = (proof(secret, b"dial", job, nonce, nonce_a, claimed, r, rail, 1 << 30, 1 << 40)
                                   if style == "secret" else secrets.token_bytes(32))
                            _send(s, PROOF.pack(MAGIC, VERSION, Msg.PROOF, mac) + frame)
                    rest, closed = _read_until_closed(s)
                    s.close()
                    try:
                        kinds = [k for k, _ in decode_messages(rest)]
                    except Exception:  # noqa: BLE001 - anything but an ACCEPT is fine
                        kinds = ["?"]
                    report.append((kind.name, r, rail, style, closed, kinds))
    store.set(DONE_KEY, "1")
    return report


def _forged_frames(rank, total, store_dir):
    n = total - 1  # the last process is the attacker
    if rank == n:
        return _forger(n, store_dir)
    return _worker(rank, n, store_dir, CFG)


def test_a_store_reader_without_the_key_gets_no_link_for_any_frame_kind():
    n = 3
    results = raise_first(run_ranks(n + 1, _forged_frames, make_comm=False, timeout=240))
    report = results[n]
    assert {k for k, *_ in report} == {k.name for k in Kind}
    for kind, r, rail, style, closed, kinds in report:
        assert closed, (kind, r, rail, style)  # every connection was closed by the rank...
        assert Msg.ACCEPT not in kinds, (kind, r, rail, style, kinds)  # ...which never proved anything
    per_rank = [sum(1 for _k, r, *_ in report if r == rank) for rank in range(n)]
    _assert_undisturbed(results, n, per_rank)


# ----------------------------------------------------------------- network fuzzer
def _mutate(rng, data):
    buf = bytearray(data)
    for _ in range(rng.choice((1, 2, 4))):
        op = rng.randrange(4)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1):]
        else:
            buf += rng.randbytes(rng.randrange(1, 100))
    return bytes(buf)


def _fuzzer(n, store_dir, seconds):
    store = FileStore(store_dir, timeout=60)
    _wait_ready(store, n)
    job, secret, addrs = _store_view(store, n)
    rng = random.Random(7)
    targets = [(r, rail, a) for r in range(n) for rail, a in enumerate(addrs[r])]
    sent = {r: 0 for r in range(n)}
    accepted = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, rail, addr = rng.choice(targets)
        claimed = rng.randrange(n)
        hello = Hello(claimed, r, rail, rng.randrange(1 << 32), rng.randrange(1 << 64), job,
                      secrets.token_bytes(32)).pack()
        frames = b"".join(rng.choice(list(FORGED.values())) for _ in range(rng.randrange(1, 4)))
        try:
            s = socket.create_connection(addr, timeout=5)
            sent[r] += 1
            what = rng.randrange(4)
            if what == 0:
                _send(s, _mutate(rng, hello))
            elif what == 1:
                _send(s, _mutate(rng, hello + PROOF.pack(MAGIC, VERSION, Msg.PROOF, bytes(32)) + frames))
            elif what == 2:  # a well-formed hello, then a mutated proof and frames
                _send(s, hello)
                s.settimeout(5)
                got = s.recv(CHALLENGE.size)
                if len(got) == CHALLENGE.size:
                    _send(s, _mutate(rng, PROOF.pack(MAGIC, VERSION, Msg.PROOF, rng.randbytes(32)) + frames))
            else:
                _send(s, _mutate(rng, frames))
            if rng.random() < 0.9:  # most say they are done; the rest leave the rank waiting for its deadline
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                rest, _closed = _read_until_closed(s, timeout=5)
            else:
                rest, _closed = _read_until_closed(s, timeout=0.05)
            s.close()
            if b"".join([MAGIC.to_bytes(4, "little"), VERSION.to_bytes(2, "little"),
                         int(Msg.ACCEPT).to_bytes(2, "little")]) in rest:
                accepted += 1
        except OSError:
            pass
    store.set(DONE_KEY, "1")
    return {"sent": sent, "accepted": accepted}


def _network_fuzz(rank, total, store_dir, seconds):
    n = total - 1  # the last process is the fuzzer
    if rank == n:
        return _fuzzer(n, store_dir, seconds)
    return _worker(rank, n, store_dir, CFG)


def test_network_fuzzer_costs_the_job_nothing():
    n = 3
    results = raise_first(run_ranks(n + 1, _network_fuzz, 4.0, make_comm=False, timeout=240))
    fuzz = results[n]
    print(f"network fuzzer: {sum(fuzz['sent'].values())} mutated handshakes and frames sent, "
          f"{[r['rejected'] for r in results[:n]]} rejected per rank, {[r['steps'] for r in results[:n]]} steps")
    assert fuzz["accepted"] == 0 and min(fuzz["sent"].values()) > 10
    _assert_undisturbed(results, n, [fuzz["sent"][r] // 2 for r in range(n)])


# ----------------------------------------------------------------- key mismatch
def _mismatch(rank, n, store_dir, keys):
    key = keys[rank]
    cfg = Config(timeout=60, connect_timeout=60, auth_key=key) if key else Config(timeout=60, connect_timeout=60)
    t0 = time.monotonic()
    try:
        with Communicator(FileStore(store_dir, timeout=60), rank, n, rails=RAILS, config=cfg):
            return ("connected", None, 0.0)
    except AuthError as exc:
        return ("AuthError", exc.peer, time.monotonic() - t0)


@pytest.mark.parametrize("keys", [("key-one-" * 4, "key-two-" * 4), ("key-one-" * 4, None)],
                         ids=["two-keys", "key-and-none"])
def test_a_key_mismatch_fails_start_up_with_the_rank_named(keys):
    # run_ranks' timeout (30 s) is well under the connect timeout (60 s): waiting it out would hang
    res = run_ranks(2, _mismatch, keys, make_comm=False, timeout=30)
    assert [r[:2] for r in res] == [("AuthError", 1), ("AuthError", 0)], res


def test_one_rank_with_another_key_stops_every_rank():
    keys = ("same-key-" * 4, "same-key-" * 4, "odd-key--" * 4)
    res = run_ranks(3, _mismatch, keys, make_comm=False, timeout=30)
    assert [r[0] for r in res] == ["AuthError"] * 3, res
    assert res[0][1] == 2 and res[1][1] == 2 and res[2][1] in (0, 1), res


def _key_file(rank, n, store_dir, path):
    os.environ["LINKESCAPE_AUTH_KEY_FILE"] = path
    try:
        cfg = Config.from_env(timeout=30)
    finally:
        del os.environ["LINKESCAPE_AUTH_KEY_FILE"]
    with Communicator(FileStore(store_dir, timeout=60), rank, n, rails=RAILS, config=cfg) as comm:
        buf = np.ones(10, np.float32)
        comm.all_reduce(buf)
        return float(buf[0]), comm._setup.auth is not None


def test_a_key_file_authenticates_the_job(tmp_path):
    path = tmp_path / "key"
    path.write_text("a-key-from-a-file-0123456789\n")
    path.chmod(0o600)
    assert raise_first(run_ranks(2, _key_file, str(path), make_comm=False, timeout=60)) == [(2.0, True)] * 2


# ----------------------------------------------------------------- floods during re-dials
def _flood(addrs, seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for addr in addrs:
            try:
                s = socket.create_connection(addr, timeout=1)
                # close with a reset: thousands of closed connections in TIME-WAIT would hold
                # the loopback's ephemeral ports for a minute and starve the tests after this one
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
                n += 1
            except OSError:
                pass
    return n


def _slow(addrs, seconds, conns=80):
    socks = []
    for i in range(conns):
        try:
            socks.append(socket.create_connection(addrs[i % len(addrs)], timeout=1))
        except OSError:
            pass
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        for s in list(socks):
            try:
                s.send(b"L")  # one byte of a HELLO a second
                sent += 1
            except OSError:
                socks.remove(s)
        time.sleep(1.0)
    for s in socks:
        s.close()
    return sent


def _redials(rank, total, store_dir):
    n = total - 2  # the last two processes attack
    if rank >= n:  # attackers on rank 0, the rank that accepts every re-dial
        store = FileStore(store_dir, timeout=60)
        _wait_ready(store, n)
        _job, _secret, addrs = _store_view(store, n)
        while not store.check(["test/cycles-started"]):
            time.sleep(0.01)
        out = (_flood if rank == n else _slow)(addrs[0], 10.0)
        store.set(f"test/attacker-done/{rank}", "1")
        return out
    store = FileStore(store_dir, timeout=60)
    with Communicator(store, rank, n, rails=RAILS, config=CFG) as comm:
        store.set(f"test/ready/{rank}", "1")
        _wait_ready(store, n)
        store.set("test/cycles-started", "1")
        time.sleep(0.5)  # the attackers get going
        came_back = wrong = 0
        for cycle in range(4):
            if rank == 0:
                comm.inject_fault(0, "cut")
            for i in range(3):
                buf = np.full(100_000, rank + i, np.float32)
                comm.all_reduce(buf)
                wrong += int(not np.all(buf == sum(r + i for r in range(n))))
            if rank == 0:
                comm.inject_fault(0, "restore")
            t0 = time.monotonic()
            while True:  # collectively: is every rail-0 link back (the higher rank re-dialed through the flood)?
                links = [l for info in comm.snapshot()["peers"].values() for l in info["links"] if l["rail"] == 0]
                flags = np.array([int(all(l["usable"] for l in links)), int(time.monotonic() - t0 > 30)], np.int32)
                comm.all_reduce(flags)
                if flags[0] == n or flags[1]:
                    break
                time.sleep(0.02)
            came_back += int(flags[0] == n)
        events = [(e["event"], e.get("rail")) for e in comm.events.recent()]
        while True:  # wait for the attackers, collectively
            done = np.array([int(store.check([f"test/attacker-done/{r}" for r in (n, n + 1)]))], np.int32)
            comm.all_reduce(done)
            if done[0] == n:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # the flood's last connections are taken and closed
        rejected = comm.snapshot()["rejected_connections"]
        return {"came_back": came_back, "wrong": wrong, "events": events, "rejected": rejected}


def test_re_dials_get_through_floods_and_slow_handshakes():
    n = 2
    results = raise_first(run_ranks(n + 2, _redials, make_comm=False, timeout=240))
    flooded, slow_bytes = results[n], results[n + 1]
    print(f"{flooded} flood connections and {slow_bytes} slow bytes against rank 0; "
          f"rank 0 rejected {results[0]['rejected']}")
    for res in results[:n]:
        assert res["wrong"] == 0 and res["came_back"] == 4, res
    assert sum(1 for e in results[1]["events"] if e == ("link_up", 0)) >= 4, results[1]["events"]
    assert flooded > 500 and results[0]["rejected"] > flooded // 2


def _all_reduce_once(comm):
    buf = np.full(16, comm.rank + 1, np.float32)
    comm.all_reduce(buf)
    return float(buf[0]), comm.snapshot()["rejected_connections"]


def test_start_up_completes_with_fewer_handshake_slots_than_dialers():
    # rank 0 accepts 4 ranks x 2 rails at once with room for 2: the evicted dial again
    cfg = Config(timeout=60, connect_timeout=60, auth_key=KEY, max_pending_handshakes=2)
    res = raise_first(run_ranks(5, _all_reduce_once, rails=RAILS, config=cfg, timeout=120))
    assert [v for v, _ in res] == [15.0] * 5
