"""JSON lines as the tools write and read them (linkescape.jsonl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from linkescape import jsonl


def test_write_append_and_read_skip_a_torn_line_and_a_missing_file(tmp_path):
    path = str(tmp_path / "x.jsonl")
    assert jsonl.read(path) == []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    jsonl.write(fd, {"a": 1, "b": [1, 2]}, compact=True)
    os.close(fd)
    jsonl.append(path, {"c": "x"})
    with open(path) as f:
        assert f.read() == '{"a":1,"b":[1,2]}\n{"c": "x"}\n'  # compact, or json.dumps' own separators
    with open(path, "a") as f:
        f.write('\n7\n{"torn": ')
    assert jsonl.read(path) == [{"a": 1, "b": [1, 2]}, {"c": "x"}]


def test_a_tail_returns_each_record_once_and_a_torn_line_when_it_is_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    tail = jsonl.Tail(str(path))
    assert tail.read() == []
    path.write_text('{"a": 1}\n{"b"')
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as f:
        f.write(': 2}\n')
    assert tail.read() == [{"b": 2}] and tail.read() == []
    assert tail.records == [{"a": 1}, {"b": 2}]


def test_encode_keeps_a_record_with_an_odd_value():
    line = jsonl.encode({"err": ValueError("x"), "p": 1})
    assert line.endswith("\n") and json.loads(line) == {"err": "x", "p": 1}
    assert jsonl.parse(b'{"a": 1}') == {"a": 1} and jsonl.parse("[1]") is None and jsonl.parse("{") is None


def test_say_writes_whole_lines_with_their_time_from_many_threads():
    code = ("import threading\n"
            "from linkescape.jsonl import say\n"
            "ts = [threading.Thread(target=lambda k=k: [say(event='x', k=k, i=i) for i in range(200)]) "
            "for k in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "say(event='exit', t=1.5)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    recs = [json.loads(line) for line in out.splitlines()]
    assert len(recs) == 801 and all(isinstance(r["t"], float) for r in recs)
    assert recs[-1] == {"event": "exit", "t": 1.5}
