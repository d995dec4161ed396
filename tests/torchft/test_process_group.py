"""linkescape.torchft.ProcessGroupLinkescape: configure per quorum, abort,
errored, set_timeout, shutdown; ranks are threads of this process over
loopback, as in torchft's own process group tests."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

import torch.distributed as dist  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402

from linkescape.errors import CommClosed, CommTimeout, PeerLost  # noqa: E402
from linkescape.torch.work import LinkEscapeBackendError  # noqa: E402
from linkescape.torchft import ProcessGroupLinkescape  # noqa: E402

SUM = dist.ReduceOp.SUM


@pytest.fixture
def store():
    s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield s


def _configure(pgs, store, prefix, quorum_id=0):
    addr = f"127.0.0.1:{store.port}/{prefix}"
    with ThreadPoolExecutor(len(pgs)) as ex:
        list(ex.map(lambda r: pgs[r].configure(addr, str(r), r, len(pgs), quorum_id), range(len(pgs))))


def _allreduce(pgs):
    def one(r):
        t = torch.tensor([float(r + 1)])
        pgs[r].allreduce([t], SUM).wait()
        return t.item()
    with ThreadPoolExecutor(len(pgs)) as ex:
        return list(ex.map(one, range(len(pgs))))


def _close(pgs):
    for pg in pgs:
        pg.shutdown()


def test_each_quorum_gets_a_working_group(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=20)) for _ in range(3)]
    try:
        for q in range(3):
            _configure(pgs, store, f"q{q}", quorum_id=q)
            assert _allreduce(pgs) == [6.0, 6.0, 6.0]
            assert all(pg.size() == 3 and pg.errored() is None for pg in pgs)
        # a smaller quorum: the third replica left
        survivors = pgs[:2]
        pgs[2].shutdown()
        _configure(survivors, store, "q3", quorum_id=3)
        assert _allreduce(survivors) == [3.0, 3.0]
        assert survivors[0].getBackendName() == "torchft-linkescape"
        assert survivors[0].communicator.world_size == 2
    finally:
        _close(pgs)


def test_abort_ends_every_call_in_flight_within_100ms(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=30)) for _ in range(2)]
    try:
        _configure(pgs, store, "abort")
        # rank 0 calls, rank 1 never does: the calls wait for it
        works = [pgs[0].allreduce([torch.ones(4)], SUM), pgs[0].barrier(), pgs[0].recv([torch.ones(2)], 1, 0)]
        time.sleep(0.2)
        assert not any(w.is_completed() for w in works)
        t0 = time.monotonic()
        pgs[0].abort()
        for w in works:
            with pytest.raises(LinkEscapeBackendError) as info:
                w.wait()
            assert isinstance(info.value.cause, CommClosed), info.value
        took = time.monotonic() - t0
        assert took < 0.1, f"abort took {took * 1e3:.0f} ms to end the calls in flight"
        # the peer learns it at once too, and a new quorum works again
        _configure(pgs, store, "after-abort", quorum_id=1)
        assert _allreduce(pgs) == [3.0, 3.0]
    finally:
        _close(pgs)


def test_errored_names_a_rank_that_left(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=30)) for _ in range(3)]
    try:
        _configure(pgs, store, "errored")
        assert pgs[0].errored() is None
        pgs[2].abort()  # as a replica whose process ends: its sockets close without a goodbye
        deadline = time.monotonic() + 5
        while pgs[0].errored() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        err = pgs[0].errored()
        assert isinstance(err, LinkEscapeBackendError) and isinstance(err.cause, PeerLost)
        assert err.peer == 2 and "aborted" in str(err)
        # a collective among the others now fails at once, in words torchft knows
        with pytest.raises(LinkEscapeBackendError) as info:
            pgs[0].allreduce([torch.ones(1)], SUM).wait()
        assert isinstance(info.value.cause, PeerLost)
    finally:
        _close(pgs)


def test_set_timeout_applies_to_the_live_group(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=60)) for _ in range(2)]
    try:
        _configure(pgs, store, "timeout")
        pgs[0].set_timeout(timedelta(seconds=0.5))
        t0 = time.monotonic()
        with pytest.raises(LinkEscapeBackendError) as info:
            pgs[0].allreduce([torch.ones(1)], SUM).wait()  # rank 1 never joins
        took = time.monotonic() - t0
        assert isinstance(info.value.cause, CommTimeout)
        assert 0.4 < took < 5, took
        assert "Timed out waiting" in str(info.value)
    finally:
        _close(pgs)


def test_a_wait_that_times_out_leaves_the_tensor_alone(store):
    """The operation owns the tensor (zero-copy) while it runs: a wait() that times out aborts the
    group before it raises, so a peer that joins late (or a path that returns) cannot write into it
    afterwards, e.g. into the next step's gradients before torchft's next quorum aborts the group."""
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=30)) for _ in range(2)]
    try:
        _configure(pgs, store, "wait-timeout")
        t = torch.ones(1024)
        work = pgs[0].allreduce([t], SUM)
        t0 = time.monotonic()
        with pytest.raises(LinkEscapeBackendError) as info:
            work.wait(timedelta(seconds=0.3))  # rank 1 has not called yet
        assert time.monotonic() - t0 < 5
        assert isinstance(info.value.cause, CommTimeout) and "Timed out waiting" in str(info.value)
        seen = t.clone()
        # rank 1 joins late: without the abort, rank 0's operation completed now and wrote 1 + 5
        try:
            pgs[1].allreduce([torch.full((1024,), 5.0)], SUM).wait(timedelta(seconds=5))
        except LinkEscapeBackendError:
            pass  # it may fail (rank 0 is gone) or complete with what rank 0 had sent
        time.sleep(0.5)
        assert torch.equal(t, seen), "the operation wrote into the tensor after its wait() timed out"
        assert work.is_completed() and not work.is_success()
        # torchft's Manager learns it from errored(); the aborted group refuses later calls
        err = pgs[0].errored()
        assert isinstance(err, LinkEscapeBackendError) and isinstance(err.cause, CommTimeout), err
        with pytest.raises(LinkEscapeBackendError) as later:
            pgs[0].allreduce([torch.ones(1)], SUM).wait()
        assert isinstance(later.value.cause, CommClosed), later.value
        # the next quorum works again and reports nothing
        _configure(pgs, store, "after-wait-timeout", quorum_id=1)
        assert _allreduce(pgs) == [3.0, 3.0]
        assert pgs[0].errored() is None
    finally:
        _close(pgs)


def test_configure_times_out_when_the_quorum_never_fills(store):
    pg = ProcessGroupLinkescape(timeout=timedelta(seconds=0.2))
    t0 = time.monotonic()
    with pytest.raises(Exception, match="timeout after 200ms"):
        pg.configure(f"127.0.0.1:{store.port}/alone", "0", 0, 2)
    assert time.monotonic() - t0 < 5


def test_import_linkescape_does_not_import_torchft():
    code = "import sys, linkescape, linkescape.torch; print('torchft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_missing_torchft_names_the_extra():
    code = ("import sys; sys.modules['torchft'] = None\n"
            "try:\n import linkescape.torchft\nexcept ImportError as e:\n print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MissingExtra" in out.stdout and "pip install 'linkescape[torchft]'" in out.stdout


def test_configure_time_measures_both_groups():
    """`python -m linkescape.torchft.configure_time` (docs/torchft.md's configure figures) runs both groups
    through quorums and reports each one's times."""
    import json
    import os

    env = dict(os.environ, LINKESCAPE_RAILS="127.0.0.1,127.0.0.2")
    out = subprocess.run([sys.executable, "-m", "linkescape.torchft.configure_time", "--ranks", "2",
                          "--quorums", "2"], capture_output=True, text=True, timeout=120, env=env, check=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    rec = json.loads(line)
    assert rec["ranks"] == 2 and rec["quorums"] == 2
    for name in ("gloo", "linkescape"):
        assert 0 < rec[name]["median_ms"] <= rec[name]["max_ms"]


def test_a_quorum_of_replicas_that_stay_keeps_their_links(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=20)) for _ in range(4)]
    try:
        _configure(pgs, store, "keep0", quorum_id=0)
        assert {pg.last_configure for pg in pgs} == {"built"}
        engines = [pg.communicator._engine for pg in pgs]
        assert _allreduce(pgs) == [10.0] * 4
        # replica 1 is lost (its process ends without a goodbye); the next quorum is the other three
        pgs[1].abort()
        survivors = [pgs[0], pgs[2], pgs[3]]
        deadline = time.monotonic() + 5
        while not all(pg.errored() for pg in survivors) and time.monotonic() < deadline:
            time.sleep(0.01)
        _configure(survivors, store, "keep1", quorum_id=1)
        assert [pg.last_configure for pg in survivors] == ["shrunk"] * 3
        # the same engines, links and sockets: no handshake, no new connection
        assert [pg.communicator._engine for pg in survivors] == [engines[0], engines[2], engines[3]]
        assert all(pg.errored() is None and pg.size() == 3 for pg in survivors)
        assert [pg.communicator.rank for pg in survivors] == [0, 1, 2]
        assert _allreduce(survivors) == [6.0] * 3
        # replica 1 comes back (a new process): a quorum with a member that is not in the group builds one
        pgs[1] = ProcessGroupLinkescape(timeout=timedelta(seconds=20))
        _configure(pgs, store, "keep2", quorum_id=2)
        assert {pg.last_configure for pg in pgs} == {"built"}
        assert _allreduce(pgs) == [10.0] * 4
    finally:
        _close(pgs)


def test_a_quorum_in_another_order_or_of_the_same_members_builds(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=20)) for _ in range(3)]
    try:
        _configure(pgs, store, "order0", quorum_id=0)
        # the same three again (a step failed, nobody left): a new group
        _configure(pgs, store, "order1", quorum_id=1)
        assert {pg.last_configure for pg in pgs} == {"built"}
        assert _allreduce(pgs) == [6.0] * 3
        # two of them, but numbered the other way round: shrink would number them 0, 1 in the old order
        pgs[0].shutdown()
        swapped = [pgs[2], pgs[1]]
        _configure(swapped, store, "order2", quorum_id=2)
        assert {pg.last_configure for pg in swapped} == {"built"}
        assert _allreduce(swapped) == [3.0, 3.0]
    finally:
        _close(pgs)


def test_reuse_off_builds_every_quorum(store):
    pgs = [ProcessGroupLinkescape(timeout=timedelta(seconds=20), reuse=False) for _ in range(3)]
    try:
        _configure(pgs, store, "off0", quorum_id=0)
        pgs[2].shutdown()
        _configure(pgs[:2], store, "off1", quorum_id=1)
        assert {pg.last_configure for pg in pgs[:2]} == {"built"}
        assert _allreduce(pgs[:2]) == [3.0, 3.0]
    finally:
        _close(pgs)
