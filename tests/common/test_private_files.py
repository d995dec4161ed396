"""Issue 48, files: what the library and its root-run tools create is private
(0700 directories, 0600 files), a planted symlink is never written through,
a directory others can write is refused, and no secret reaches a report."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import types

import pytest

from linkescape.chaos.controller import ChaosOptions, run_dir
from linkescape.errors import ConfigError, RendezvousError
from linkescape.events import EventLog
from linkescape.flight import FlightRecorder
from linkescape.log import setup_logging
from linkescape.private import open_private, private_dir, redact_env
from linkescape.store import MAX_VALUE, FileStore
from linkescape.testbed.job import RankJob

SECRET = "5ecret-key-of-the-job-5ecret-key-of-the-job"


def _victim(tmp_path):
    """A file root must never truncate nor append to (what the planted link points at)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _sleeper():
    return [[sys.executable, "-c", "import time; time.sleep(30)"]]


def test_a_symlink_planted_in_a_run_directory_is_never_followed(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    os.symlink(victim, run / "stop")  # a local user planted it before root stops the job
    job = RankJob(_sleeper(), workdir=str(run))
    try:
        with pytest.raises(ConfigError, match="symlink"):
            job.stop()
    finally:
        for p in job.procs:
            p.kill()
            p.wait()
        job.close()
    assert victim.read_text() == "precious\n"


def test_run_directories_are_0700_and_one_others_can_write_is_refused(tmp_path):
    job = RankJob(_sleeper())
    try:
        assert _mode(job.dir) == 0o700 and os.path.basename(job.dir).startswith("linkescape-job-")
    finally:
        for p in job.procs:
            p.kill()
            p.wait()
        job.close()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="writable by group or others"):
        RankJob(_sleeper(), workdir=str(shared))
    with pytest.raises(ConfigError, match="writable by group or others"):
        run_dir(ChaosOptions(out=str(shared)))
    d = run_dir(ChaosOptions(seed=7))  # no --out: unpredictable, 0700
    try:
        assert _mode(d) == 0o700 and os.path.basename(d).startswith("linkescape-chaos-s7-")
    finally:
        os.rmdir(d)
    link = tmp_path / "link"
    os.symlink(tmp_path / "run-elsewhere", link)
    with pytest.raises(ConfigError):
        private_dir(str(link))


def test_event_logs_debug_logs_and_dumps_are_0600_and_never_through_a_link(tmp_path):
    victim = _victim(tmp_path)
    os.symlink(victim, tmp_path / "events-0.jsonl")
    with pytest.raises(ConfigError, match="symlink"):
        EventLog(0, str(tmp_path / "events-{rank}.jsonl"))
    ev = EventLog(1, str(tmp_path / "events-{rank}.jsonl"))
    ev.emit("link_down", peer=0, rail=0)
    ev.close() if hasattr(ev, "close") else None
    assert _mode(tmp_path / "events-1.jsonl") == 0o600

    os.symlink(victim, tmp_path / "log-0.txt")
    with pytest.raises(ConfigError, match="symlink"):
        setup_logging(0, {"LINKESCAPE_DEBUG": "INFO", "LINKESCAPE_DEBUG_FILE": str(tmp_path / "log-{rank}.txt")})
    try:
        setup_logging(1, {"LINKESCAPE_DEBUG": "INFO", "LINKESCAPE_DEBUG_FILE": str(tmp_path / "log-{rank}.txt")})
        logging.getLogger("linkescape").info("hello")
        assert _mode(tmp_path / "log-1.txt") == 0o600
    finally:
        setup_logging(0, {}, stream=sys.stderr)
    assert victim.read_text() == "precious\n"

    fr = FlightRecorder(8, 0, 2, trace_dir=str(tmp_path / "traces"), job="abcdef0123")
    p1, p2 = fr.dump("manual", force=True), fr.dump("manual", force=True)
    assert p1 and p2 and p1 != p2
    assert _mode(p1) == 0o600 and _mode(tmp_path / "traces") == 0o700
    # the name is not predictable: a link planted under the old name (rank, pid, count, reason) is never met
    assert not os.path.basename(p1).endswith(f"-{os.getpid()}-1-manual.json") and p1.endswith("-manual.json")
    json.loads(open(p1).read())


def test_open_private_refuses_links_other_users_files_and_hard_links(tmp_path):
    victim = _victim(tmp_path)
    os.link(victim, tmp_path / "hard")
    with pytest.raises(ConfigError, match="hard links"):
        open_private(str(tmp_path / "hard"), "a")
    with pytest.raises(FileExistsError):
        open_private(str(victim), "x")
    assert victim.read_text() == "precious\n"


def test_file_store_refuses_a_directory_others_can_write_and_bounds_what_it_reads(tmp_path):
    shared = tmp_path / "store"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="writable by group or others"):
        FileStore(str(shared))
    os.chmod(shared, 0o700)
    store = FileStore(str(shared), timeout=0.2)
    store.set("a", b"1")
    assert store.get("a") == b"1"
    victim = _victim(tmp_path)
    os.symlink(victim, store._file("linked"))
    with pytest.raises(RendezvousError):
        store.get("linked")
    with open(store._file("big"), "wb") as f:
        f.truncate(MAX_VALUE + 1)
    with pytest.raises(RendezvousError, match="more than"):
        store.get("big")


def test_the_key_is_absent_from_every_report(tmp_path, monkeypatch):
    from linkescape.demo.report import _header

    monkeypatch.setenv("LINKESCAPE_AUTH_KEY", SECRET)
    monkeypatch.setenv("LINKESCAPE_SILENT_TIMEOUT_MS", "300")
    opts = types.SimpleNamespace(model_size="tiny", seed=1, steps=3, out=str(tmp_path))
    rep = _header(opts, {"mode": "live", "testbed": None})
    text = json.dumps(rep)
    assert SECRET not in text
    assert rep["library_settings"]["env"]["LINKESCAPE_AUTH_KEY"] == "<redacted>"
    assert rep["library_settings"]["env"]["LINKESCAPE_SILENT_TIMEOUT_MS"] == "300"
    from linkescape.chaos.controller import report_options

    chaos = report_options(ChaosOptions(env={"LINKESCAPE_AUTH_KEY": SECRET, "LINKESCAPE_FRAME_AUTH": "1"}))
    assert SECRET not in json.dumps(chaos, default=str) and chaos["env"]["LINKESCAPE_FRAME_AUTH"] == "1"
    env = redact_env({"LINKESCAPE_AUTH_KEY": SECRET, "LINKESCAPE_AUTH_KEY_FILE": "/run/k", "X_TOKEN": "t"})
    assert env == {"LINKESCAPE_AUTH_KEY": "<redacted>", "LINKESCAPE_AUTH_KEY_FILE": "/run/k", "X_TOKEN": "<redacted>"}


@pytest.mark.parametrize("mode", ["a", "w"])
def test_open_private_refuses_a_planted_fifo_at_once(tmp_path, mode):
    """Issue 48 review: before, open_private(path, "a") on a FIFO planted at ``path`` blocked
    forever (an open for writing waits for a reader)."""
    import threading

    fifo = str(tmp_path / "events.jsonl")
    os.mkfifo(fifo, 0o600)
    got = []

    def opener():
        try:
            os.close(open_private(fifo, mode))
            got.append("opened")
        except ConfigError as exc:
            got.append(exc)

    t = threading.Thread(target=opener, daemon=True)
    t.start()
    t.join(5.0)
    if t.is_alive():  # blocked: give it a reader so that the thread ends, then fail
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        t.join(5.0)
        os.close(fd)
        pytest.fail(f"open_private({mode!r}) blocked on a FIFO")
    assert len(got) == 1 and isinstance(got[0], ConfigError), got
    # with a reader on the FIFO the open succeeds at once: fstat refuses it
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            open_private(fifo, mode)
    finally:
        os.close(fd)
    # a regular file is written with a blocking descriptor as before
    plain = tmp_path / "plain"
    fd = open_private(str(plain), mode)
    try:
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
