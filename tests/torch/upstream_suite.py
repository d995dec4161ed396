"""PyTorch's own backend suite, shipped in the torch wheel
(``torch.testing._internal.distributed.distributed_test``), run against a
backend exactly as torch runs it against Gloo: ``TestDistBackend`` +
``DistributedTest._DistTestBase``, one spawned process per rank.

    python tests/torch/upstream_suite.py --backend linkescape [--world-size 3] [-k PATTERN] [--json PATH]
    python tests/torch/upstream_suite.py --backend gloo

``--start fork`` forks each test's ranks from the runner instead of spawning
them (``MultiProcessTestCase._start_processes`` with a fork context): the same tests and backend
calls, without each rank importing torch and the suite again (about 3
CPU-seconds a rank). ``make test``'s subset runs so; the full run documented
in docs/torch.md spawns, as torch's runner does.

It sets ``BACKEND``, ``WORLD_SIZE`` and ``INIT_METHOD=env://`` (unless
already set) and, as torch's own runner does for Gloo, adds the backend to
``DistTestCases.backend_feature["ddp"]``, ``["subgroup"]`` and ``["plugin"]``
before importing the suite (at import time of this module, so that spawned
ranks, which re-import it, see the same). A test counts as *applicable* when
it runs (passes or fails) rather than being skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unittest


def _early_args(argv):
    """--backend / --world-size, read before the suite is imported."""
    vals = {}
    for i, a in enumerate(argv):
        for name in ("--backend", "--world-size"):
            if a == name and i + 1 < len(argv):
                vals[name] = argv[i + 1]
            elif a.startswith(name + "="):
                vals[name] = a.split("=", 1)[1]
    return vals


if __name__ == "__main__":
    _vals = _early_args(sys.argv[1:])
    if "--backend" in _vals:
        os.environ["BACKEND"] = _vals["--backend"]
    if "--world-size" in _vals:
        os.environ["WORLD_SIZE"] = _vals["--world-size"]
os.environ.setdefault("BACKEND", "linkescape")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("INIT_METHOD", "env://")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (the environment above must be set first)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

BACKEND = os.environ["BACKEND"]
for _feature in ("ddp", "subgroup", "plugin"):
    if BACKEND != "gloo" or _feature != "plugin":  # gloo is built in, not a plugin
        DistTestCases.backend_feature[_feature].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


#: ``fork``: the ranks are forked from the runner (``--start fork``), not spawned
START_VAR = "LINKESCAPE_SUITE_START"


class TestBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's ``TestDistBackendWithSpawn`` (test/distributed/test_distributed_spawn.py)."""

    def setUp(self):
        super().setUp()
        if os.environ.get(START_VAR) == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Result(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcome = {}
        self._t0 = {}

    def startTest(self, test):
        self._t0[test.id()] = time.monotonic()
        super().startTest(test)

    def _set(self, test, what):
        name = test.id().rsplit(".", 1)[-1]
        self.outcome[name] = {"result": what, "seconds": round(time.monotonic() - self._t0.get(test.id(), 0), 2)}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._set(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "fail")

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, "fail")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skip")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._set(test, "fail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set(test, "pass")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=BACKEND)
    ap.add_argument("--world-size", default=os.environ["WORLD_SIZE"])
    ap.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    ap.add_argument("--only", action="append", default=[], help="run the test of exactly this name (repeatable)")
    ap.add_argument("--json", help="write per-test outcomes and counts here")
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                    help="how each test's ranks start: spawned, as torch's own runner does (each re-imports "
                         "the suite, about 3 CPU-seconds), or forked from this process")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args(argv)
    os.environ[START_VAR] = args.start
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestBackendWithSpawn)
    if args.k or args.only:
        names = [n for n in names if any(k in n for k in args.k) or n in args.only]
    suite = unittest.TestSuite(TestBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2 if args.v else 1, stream=sys.stderr)
    t0 = time.monotonic()
    res = runner.run(suite)
    counts = {k: sum(1 for o in res.outcome.values() if o["result"] == k) for k in ("pass", "fail", "skip")}
    counts["applicable"] = counts["pass"] + counts["fail"]
    summary = {"backend": BACKEND, "world_size": int(os.environ["WORLD_SIZE"]), "torch": torch.__version__,
               "seconds": round(time.monotonic() - t0, 1), "counts": counts,
               "failed": sorted(n for n, o in res.outcome.items() if o["result"] == "fail"),
               "tests": res.outcome}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    print(json.dumps({k: summary[k] for k in ("backend", "world_size", "torch", "seconds", "counts", "failed")}))
    return 0 if counts["fail"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
