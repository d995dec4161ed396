"""docs/operations.md: every metric it lists is exported by real ranks, and its dashboard uses only those."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from linkescape import CommTimeout, Config
from linkescape.testing import raise_first, run_ranks
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "observe"))  # (its helpers live there)
from test_metrics_server import free_base  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "operations.md")
#: exported only once something happens that this test does not make happen
#: (replays are in the snapshot only on some engines; no-path time needs every rail down);
#: tests/observe/test_metrics.py covers them with the snapshots and events that carry them
CONDITIONAL = {"linkescape_replayed_bytes_total", "linkescape_stall_seconds_total", "linkescape_relay_bytes_total"}


def doc_metrics():
    text = open(DOC, encoding="utf-8").read()
    table = {m for m in re.findall(r"^\| `(linkescape_[a-z_]+)` \|", text, re.M)}
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", text, re.S)]
    dash = next(b for b in blocks if "panels" in b)
    used = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            used |= {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"linkescape_[a-z_]+", t["expr"])}
    used |= set(re.findall(r"linkescape_[a-z_]+", json.dumps(dash["templating"])))
    return table, used


def _ranks(comm, base, flag):
    buf = np.ones(1 << 16, np.float32)
    comm.all_reduce(buf)
    if comm.rank == 0:
        comm.inject_fault(0, "cut")
    comm.all_reduce(buf)
    comm.broadcast(buf, 1)
    if comm.rank == 0:
        try:  # nobody sends this: an operation that ends with an error
            comm.recv(np.zeros(4, np.float32), 1, tag=99)
        except CommTimeout:
            pass
        open(flag, "w").close()
    else:  # the barrier's deadline must not start before rank 0 is back from its recv
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.02)
    comm.barrier()
    text = urllib.request.urlopen(f"http://127.0.0.1:{base + comm.rank}/metrics", timeout=5).read().decode()
    comm.barrier()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_documented_metric_is_exported_and_the_dashboard_uses_them(tmp_path):
    table, used = doc_metrics()
    assert {"linkescape_bytes_sent_total", "linkescape_bytes_received_total", "linkescape_link_up",
            "linkescape_link_events_total", "linkescape_failover_seconds"} <= table
    assert used and used <= table, used - table
    base = free_base(2)
    cfg = Config(metrics_port=base, timeout=2.0)
    names = raise_first(run_ranks(2, _ranks, base, str(tmp_path / "flag"), rails=("127.0.0.1", "127.0.0.2"), config=cfg, timeout=90))[0]
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
    missing = table - CONDITIONAL - families
    assert not missing, missing
    undocumented = {n for n in families if n.startswith("linkescape_")} - table
    assert not undocumented, undocumented
