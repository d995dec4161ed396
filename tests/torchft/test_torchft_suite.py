"""torchft's own tests (``process_group_test.py``, ``manager_integ_test.py`` of the torchft 0.2.0 wheel)
with torchft's Gloo group, then with linkescape's group in its place (``-p gloo_to_linkescape``):
linkescape's group passes every test that torchft's Gloo group passes here, and at least as many.

The tests of torchft's subprocess groups (``Baby*``: they run Gloo or NCCL in a child process and do
not use the group under test) and of CUDA are left out of both runs: 35 pass in each run here, 29 are
skipped (2026-12-06). About 2 minutes on 2 cores: ``make soak`` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("torchft")
pytest.importorskip("parameterized")

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("process_group_test.py", "manager_integ_test.py")


def _run(tmp_path, name: str, plugin: bool, select: str = "not Baby") -> dict:
    import torchft

    pkg = os.path.dirname(torchft.__file__)
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    xml = tmp_path / f"{name}.xml"
    argv = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
            "-q", "--timeout", "120", "-k", select, f"--junitxml={xml}"]
    # torchft names parameterized cases by their index in a list made from a set: the same hash seed in
    # both runs gives them the same names
    env = dict(os.environ, PYTHONHASHSEED="0")
    if plugin:
        argv += ["-p", "gloo_to_linkescape"]
        env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    argv += [os.path.join(pkg, f) for f in FILES]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert xml.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        kids = {c.tag for c in case}
        outcomes[key] = ("failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed")
    (tmp_path / f"{name}.log").write_text(proc.stdout[-20000:])
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_linkescape_passes_what_torchft_gloo_passes(tmp_path):
    gloo = _run(tmp_path, "gloo", plugin=False)
    ours = _run(tmp_path, "linkescape", plugin=True)

    def count(res, what):
        return sum(1 for v in res.values() if v == what)

    summary = {k: (count(gloo, k), count(ours, k)) for k in ("passed", "failed", "skipped")}
    print("torchft's tests (gloo, linkescape):", summary)
    assert set(gloo) == set(ours), "the two runs collected different tests"
    lost = sorted(k for k, v in gloo.items() if v == "passed" and ours[k] != "passed")
    # Some of torchft's tests race in themselves: test_ddp_skip_init_sync seeds torch's global RNG under
    # a lock and draws the model's weights, while the other replica's thread draws its first batch from
    # the same RNG outside that lock; the two replicas then start from different weights (seen 1 in 34
    # runs with linkescape's group, 0 in 44 with Gloo's, under load; with 50 ms more between the seed
    # and the draws, Gloo's group fails it 2 in 3). A test lost in the whole run is run alone twice more
    # and counts as passed only when both pass.
    for key in list(lost):
        cls, test = key.rsplit("::", 1)
        select = f"{cls.rsplit('.', 1)[-1]} and {test}"
        again = []
        for i in range(2):
            where = tmp_path / f"again{i}"
            where.mkdir(exist_ok=True)
            again.append(_run(where, "linkescape", plugin=True, select=select).get(key))
        print(f"{key}: lost in the whole run, alone again: {again}")
        if again == ["passed", "passed"]:
            lost.remove(key)
            ours[key] = "passed"
    assert not lost, f"passed with torchft's Gloo group, not with linkescape's: {lost}"
    assert count(ours, "passed") >= count(gloo, "passed") > 30, summary
    # the group under test really was linkescape's where torchft's tests name ProcessGroupGloo
    assert any("ManagerIntegTest" in k for k, v in ours.items() if v == "passed")
