"""DDP-style job on the testbed: every rail of one host is cut for longer than
the no-path deadline; torch raises a DistBackendError carrying LinkFailure."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.testbed


def script_main(flag_dir: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=60))
    from linkescape.errors import LinkFailure, PeerLost
    from linkescape.torch import LinkEscapeBackendError

    r = dist.get_rank()
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    open(os.path.join(flag_dir, f"ready{r}"), "w").close()
    start = time.monotonic()
    outcome = {"rank": r}
    try:
        for _ in range(100_000):
            dist.all_reduce(t)
            time.sleep(0.01)
        outcome["error"] = None
    except LinkEscapeBackendError as exc:
        outcome.update(error=type(exc.cause).__name__, took=time.monotonic() - start,
                       is_dist=isinstance(exc, dist.DistBackendError),
                       typed=isinstance(exc.cause, (LinkFailure, PeerLost)))
    print("OUTCOME " + json.dumps(outcome), flush=True)
    os._exit(0)


def test_all_rails_lost_beyond_deadline_raises_link_failure(testbed_factory, tmp_path):
    from linkescape.testbed.launch import launch

    tb = testbed_factory(2, 2)
    out = io.StringIO()
    env = {"LINKESCAPE_NO_PATH_TIMEOUT": "1.5", "LINKESCAPE_EVENTS": str(tmp_path / "ev-{rank}.jsonl")}
    rc = {}

    def run():
        rc["rc"] = launch(tb, [os.path.abspath(__file__), str(tmp_path)], env=env, timeout=90, stdout=out)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    time.sleep(0.3)
    tb.cut(0, 0)
    tb.cut(0, 1)
    th.join(120)
    text = out.getvalue()
    outcomes = {o["rank"]: o for o in (json.loads(line.split("OUTCOME ", 1)[1])
                                       for line in text.splitlines() if "OUTCOME " in line)}
    assert set(outcomes) == {0, 1}, text
    # the host that lost every rail: LinkFailure after the deadline, through torch
    assert outcomes[0]["error"] == "LinkFailure", outcomes
    assert outcomes[0]["is_dist"] and 1.0 < outcomes[0]["took"] < 30, outcomes
    # its peer cannot tell a host that lost all its rails from a dead one
    assert outcomes[1]["error"] in ("LinkFailure", "PeerLost") and outcomes[1]["typed"], outcomes


if __name__ == "__main__":
    script_main(sys.argv[1])
