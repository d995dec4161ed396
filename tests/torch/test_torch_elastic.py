"""``torchrun --max-restarts 1`` over linkescape: a rank SIGKILLs itself
mid-job, the elastic agent restarts the group, and the job goes on from its
last checkpoint (examples/elastic_checkpoint.py) to the same parameters as
an uninterrupted run."""

from __future__ import annotations

import os

import torch

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "elastic_checkpoint.py")


def _torchrun(ckpt, extra, launcher_args):
    from linkescape.torch.testing import torchrun

    for _ in range(3):  # the launcher's port may be taken between choosing and binding it
        res = torchrun([os.path.abspath(EXAMPLE), "--ckpt", str(ckpt), "--steps", "8", *extra], 2, timeout=200,
                       launcher_args=launcher_args)
        if "EADDRINUSE" not in res.stderr:
            return res
    return res


def test_torchrun_max_restarts_resumes_from_checkpoint(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    killed.mkdir()
    clean.mkdir()
    res = _torchrun(killed, ["--kill-at", "5"], ["--max-restarts=1"])
    assert res.returncode == 0 and not res.timed_out, res.describe()
    out = res.stdout
    for r in (0, 1):
        assert f"rank {r}: attempt 0 starts at step 0" in out, out
        assert f"rank {r}: attempt 1 starts at step 5" in out, out  # resumed after the step-4 checkpoint
        assert f"rank {r}: done at step 8 after 1 restart(s)" in out, out
    ref = _torchrun(clean, [], ["--max-restarts=0"])
    assert ref.returncode == 0, ref.describe()
    a = torch.load(killed / "final.pt")
    b = torch.load(clean / "final.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after the restart"
