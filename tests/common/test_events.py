"""Tests of the event trail (EventLog)."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from linkescape.events import CAUSES, EVENTS, FIELDS, EventLog, expand_path, read_events


def test_contract_names():
    assert EVENTS == ("link_down", "failover", "link_up", "failback", "no_path", "peer_lost", "relay_on", "relay_off",
                      "shrink")
    assert CAUSES == ("carrier", "peer_carrier", "socket_error", "timeout", "protocol_error", "degraded",
                      "path_back", "unreachable", "via_lost")


def test_rank_substitution_and_parent_dirs(tmp_path):
    template = str(tmp_path / "deep" / "er" / "events-{rank}.jsonl")
    with EventLog(3, template) as log:
        assert log.path == str(tmp_path / "deep" / "er" / "events-3.jsonl")
        log.emit("link_down", peer=1, rail=0, cause="carrier")
    assert (tmp_path / "deep" / "er" / "events-3.jsonl").exists()
    assert expand_path("/x/{rank}/{rank}.{json}", 7) == "/x/7/7.{json}"


def test_file_contents_and_flush(tmp_path):
    path = tmp_path / "ev-{rank}.jsonl"
    log = EventLog(2, str(path))
    try:
        r1 = log.emit("link_down", peer=1, rail=0, cause="carrier", ts=1000.5, detail="eth1 lost carrier")
        r2 = log.emit("failover", peer=1, rail=1, cause="carrier", from_rail=0, to_rail=1, since=1000.5)
        log.emit("peer_lost", peer=3, rail=None)
        # read before close: every line must already be on disk
        lines = (tmp_path / "ev-2.jsonl").read_text().splitlines()
        assert len(lines) == 3
        recs = [json.loads(line) for line in lines]
        assert list(recs[0])[:6] == list(FIELDS)
        assert recs[0] == {"ts": 1000.5, "rank": 2, "event": "link_down", "peer": 1, "rail": 0,
                           "cause": "carrier", "detail": "eth1 lost carrier"}
        assert recs[0] == r1
        assert recs[1]["from_rail"] == 0 and recs[1]["to_rail"] == 1 and recs[1]["since"] == 1000.5
        assert isinstance(recs[1]["ts"], float) and recs[1] == r2
        assert recs[2]["cause"] is None and recs[2]["rail"] is None
    finally:
        log.close()
    # append mode: a second log on the same path adds, never truncates
    with EventLog(2, str(path)) as again:
        again.emit("link_up", peer=1, rail=0, cause="carrier")
    assert [r["event"] for r in read_events(str(tmp_path / "ev-2.jsonl"))] == [
        "link_down", "failover", "peer_lost", "link_up"]


def test_invalid_names_raise(tmp_path):
    log = EventLog(0, str(tmp_path / "e.jsonl"))
    with pytest.raises(ValueError):
        log.emit("link_flap", peer=1, rail=0, cause="carrier")
    with pytest.raises(ValueError):
        log.emit("link_down", peer=1, rail=0, cause="cosmic_ray")
    with pytest.raises(ValueError):
        log.emit("link_down", peer=1, rail=0, cause="carrier", rank=5)  # would overwrite a field
    log.close()
    assert (tmp_path / "e.jsonl").read_text() == ""
    assert log.recent() == []


def test_no_file_recent_and_subscribers(caplog):
    log = EventLog(1, None)
    got = []
    log.subscribe(got.append)

    def broken(_record):
        raise RuntimeError("subscriber bug")

    log.subscribe(broken)
    with caplog.at_level(logging.INFO, logger="linkescape.events"):
        for i in range(5):
            log.emit("link_up" if i % 2 else "link_down", peer=0, rail=i, cause="timeout")
    assert [r["rail"] for r in got] == [0, 1, 2, 3, 4]
    assert [r["rail"] for r in log.recent(2)] == [3, 4]
    assert len(log.recent()) == 5 and log.recent(0) == []
    # the subscriber's exception was logged, not raised
    assert any("subscriber" in rec.getMessage() and rec.exc_info for rec in caplog.records)
    levels = {rec.getMessage().split()[1]: rec.levelno for rec in caplog.records
              if rec.getMessage().split()[:2][-1] in EVENTS}
    assert levels == {"link_down": logging.WARNING, "link_up": logging.INFO}
    log.unsubscribe(broken)
    log.unsubscribe(got.append)
    log.emit("failback", peer=0, rail=0, cause="carrier")
    assert len(got) == 5


def test_keep_limit_and_threads(tmp_path):
    log = EventLog(0, str(tmp_path / "t.jsonl"), keep=10)

    def worker(n):
        for i in range(200):
            log.emit("link_down", peer=n, rail=i, cause="socket_error")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert len(log.recent()) == 10
    recs = read_events(str(tmp_path / "t.jsonl"))
    assert len(recs) == 800  # every line intact, none interleaved


def test_from_env(tmp_path):
    log = EventLog.from_env(4, {"LINKESCAPE_EVENTS": str(tmp_path / "{rank}.jsonl")})
    log.emit("no_path", peer=2, rail=None, cause="timeout")
    log.close()
    assert read_events(str(tmp_path / "4.jsonl"))[0]["event"] == "no_path"
    assert EventLog.from_env(0, {}).path is None
