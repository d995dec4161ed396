"""A benchmark's rank process ends without the interpreter's finalization (bench/leave.py): its
atexit handlers run and its output arrives, its exit status is the rank's, and nothing that
finalization would do (here an object's ``__del__`` at shutdown) runs. 64 ranks finalizing
together on 2 cores outlasted the launcher's 15 s grace after a run whose rows were all measured."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys

    class Finalized:
        def __del__(self):
            print("finalized", flush=True)

    kept = Finalized()  # a module global: deleted only by the interpreter's finalization
    atexit.register(lambda: print("atexit ran"))
    print("buffered line", end="")  # (not flushed: leave flushes it)
    sys.stderr.write("to stderr")

    from linkescape.bench.leave import leave

    leave(int(sys.argv[1]))
    print("never here")
""")


@pytest.mark.parametrize("rc", [0, 3])
def test_a_rank_leaves_with_its_status_its_atexit_handlers_and_its_output_but_no_finalization(rc):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(rc)], capture_output=True, text=True, timeout=60)
    assert run.returncode == rc, run.stderr
    assert "atexit ran" in run.stdout and "buffered line" in run.stdout, run.stdout
    assert "to stderr" in run.stderr
    assert "never here" not in run.stdout
    assert "finalized" not in run.stdout  # the interpreter's finalization did not run


def test_without_leave_the_same_script_is_finalized():
    """(the check above can fail: a normal exit finalizes that object)"""
    script = SCRIPT.replace("leave(int(sys.argv[1]))", "sys.exit(int(sys.argv[1]))")
    run = subprocess.run([sys.executable, "-c", script, "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "finalized" in run.stdout, (run.stdout, run.stderr)


SITE = textwrap.dedent("""
    class _Finalized:
        def __del__(self):
            print("finalized", flush=True)

    _kept = _Finalized()  # sitecustomize stays imported: deleted only by the interpreter's finalization
""")

ONE_RANK = {
    "linkescape.bench.runner": lambda tmp: ["--rank", "0", "--store", f"file:{tmp / 'store'}", "--spec",
                                            '{"ops": ["all_reduce"], "sizes": [4], "world_size": 1, '
                                            '"iters": 1, "warmup": 0}'],
    "linkescape.bench.scale": lambda tmp: ["--rank", "0", "--world-size", "1", "--port", "0", "--idle", "0.1",
                                           "--rounds", "1"],
}


@pytest.mark.parametrize("module", sorted(ONE_RANK))
def test_the_rank_entry_points_end_a_whole_run_this_way(module, tmp_path):
    """A one-rank run of each rank entry point (``python -m``, as the launchers start them) ends
    with status 0, its last event out, and no finalization; the same run through a normal
    ``sys.exit`` is finalized (what the check tells apart)."""
    import os

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    run = subprocess.run([sys.executable, "-m", module, *ONE_RANK[module](tmp_path / "a")], capture_output=True, text=True, timeout=120,
                         env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    last = [line for line in run.stdout.splitlines() if line.startswith("@@")][-1]
    assert '"done"' in last or '"result"' in last, last
    assert "finalized" not in run.stdout
    args = ONE_RANK[module](tmp_path / "b")  # (a store of its own)
    normal = subprocess.run([sys.executable, "-c", f"import sys; from {module} import rank_main; "
                             f"sys.exit(rank_main({args!r}))"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert normal.returncode == 0 and "finalized" in normal.stdout, normal.stderr[-2000:]
