"""Test helpers: run a function on N ranks in separate processes.

``run_ranks(n, fn, *args)`` forks ``n`` processes, each builds a Communicator
over a fresh FileStore and returns ``fn(comm, *args)``; the parent gets the
list of results (an exception raised in a rank is returned as that exception
object). A rank that does not finish within ``timeout`` is killed and the call
raises ``RanksHung`` — a hung collective is a bug, never a slow test.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import traceback
from typing import Any, Callable, List, Optional, Sequence

from .config import Config
from ..protocol.frames import HEADER_SIZE, unpack_header


class RanksHung(AssertionError):
    pass


class RankError(Exception):
    """Wraps an exception that a rank raised but that does not pickle."""


def _child(conn, rank: int, n: int, store_dir: str, rails, config, fn, args, make_comm: bool) -> None:
    result: Any
    try:
        if make_comm:
            from ..comm.communicator import Communicator
            from .store import FileStore

            comm = Communicator(FileStore(store_dir, timeout=60), rank, n, rails=rails, config=config)
            try:
                result = fn(comm, *args)
            finally:
                comm.close()
        else:
            result = fn(rank, n, store_dir, *args)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        exc.__traceback_text__ = traceback.format_exc()  # type: ignore[attr-defined]
        result = exc
    try:
        conn.send_bytes(pickle.dumps(result))
    except Exception as exc:  # noqa: BLE001
        conn.send_bytes(pickle.dumps(RankError(f"{type(result).__name__}: {result} ({exc})")))
    conn.close()
    os._exit(0)


def run_ranks(n: int, fn: Callable, *args, rails: Optional[Sequence[str]] = ("127.0.0.1",),
              config: Optional[Config] = None, timeout: float = 60.0, make_comm: bool = True) -> List[Any]:
    ctx = mp.get_context("fork")
    store_dir = tempfile.mkdtemp(prefix="linkescape-store-")
    procs, conns = [], []
    try:
        for rank in range(n):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(child, rank, n, store_dir, rails, config, fn, args, make_comm),
                            daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        results: List[Any] = [None] * n
        import time

        deadline = time.monotonic() + timeout
        for rank, conn in enumerate(conns):
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                raise RanksHung(f"rank {rank} of {n} did not finish within {timeout}s")
            try:
                results[rank] = pickle.loads(conn.recv_bytes())
            except EOFError:
                results[rank] = RankError(f"rank {rank} died (exit code {procs[rank].exitcode})")
        return results
    finally:
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(store_dir, ignore_errors=True)


def raise_first(results: List[Any]) -> List[Any]:
    """Re-raise the first exception a rank returned (with its traceback text); the message also
    says what every other rank that failed raised (the first to fail is not always the cause: a
    rank that timed out and closed makes its peers raise PeerLost)."""
    failed = [(rank, res) for rank, res in enumerate(results) if isinstance(res, BaseException)]
    if failed:
        rank, res = failed[0]
        text = getattr(res, "__traceback_text__", "")
        others = "".join(f"\nrank {r} raised {type(e).__name__}: {e}" for r, e in failed[1:])
        raise AssertionError(f"rank {rank} raised {type(res).__name__}: {res}\n{text}{others}") from res
    return results


def drain(sock) -> bytes:
    """All a non-blocking socket holds now (the far end of a link, in a test)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return data


def frame_headers(data) -> list:
    """The headers of the whole frames in ``data`` (bytes read from a link's far end), in order."""
    out, pos = [], 0
    while pos + HEADER_SIZE <= len(data):
        h = unpack_header(data[pos:pos + HEADER_SIZE])
        out.append(h)
        pos += HEADER_SIZE + h.length
    return out


def job_keys(n: int, secret: bytes = b"k" * 32, job: bytes = b"job") -> list:
    """The X25519 keys (protocol/relaymac.RankKeys) of ranks 0..n-1 of one job, each knowing the
    others' public keys, as the store's records give them: for rigs that pass relayed frames by
    hand (``keys[src].pair(dst).seal(...)``)."""
    from ..protocol.relaymac import RankKeys

    keys = [RankKeys(r, secret, job) for r in range(n)]
    for a in keys:
        for b in keys:
            if a is not b:
                a.learn(b.rank, b.public)
    return keys
