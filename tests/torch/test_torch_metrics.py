"""The torch backend serves metrics too: at the process group's rank, offset by LOCAL_RANK, subgroups on the same server."""

from __future__ import annotations

import json
import os
import sys

from linkescape.torch.testing import failures, launch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "observe"))  # (its helpers live there)
from test_metrics_server import free_base  # noqa: E402

SCRIPT = r"""
import json, os, sys, urllib.request
import torch, torch.distributed as dist
from prometheus_client.parser import text_string_to_metric_families
dist.init_process_group("linkescape")
r = dist.get_rank()
t = torch.ones(1000)
dist.all_reduce(t)
sub = dist.new_group([0, 1])
dist.all_reduce(torch.ones(10), group=sub)
port = int(os.environ["LINKESCAPE_METRICS_PORT"]) + int(os.environ["LOCAL_RANK"])
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
samples = [[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]
dist.barrier()
dist.destroy_process_group()
print("RESULT " + json.dumps({"rank": r, "port": port, "samples": samples}))
"""


def test_torch_ranks_serve_at_local_rank_offsets_with_subgroups_labelled():
    base = free_base(2)
    # LOCAL_RANK reversed: the port follows LOCAL_RANK, not the rank
    res = launch(["-c", SCRIPT], 2, env={"LINKESCAPE_METRICS_PORT": str(base)}, timeout=120,
                 per_rank_env={0: {"LOCAL_RANK": "1"}, 1: {"LOCAL_RANK": "0"}})
    assert not failures(res), failures(res)
    for r in res:
        out = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
        assert out["port"] == base + (1 - out["rank"])
        info = [(lab, v) for name, lab, v in out["samples"] if name == "linkescape_info"]
        assert {lab.get("comm", "") for lab, _ in info} == {"", "1"}
        assert all(lab["rank"] == str(out["rank"]) and lab["world_size"] == "2" for lab, _ in info)
        ops = {lab.get("comm", ""): v for name, lab, v in out["samples"]
               if name == "linkescape_op_bytes_total" and lab["op"] == "all_reduce"}
        assert ops[""] >= 4000 and ops["1"] == 40
        up = [v for name, lab, v in out["samples"]
              if name == "linkescape_link_up" and lab["peer"] == str(1 - out["rank"]) and "comm" not in lab]
        assert up and all(v == 1 for v in up)
