"""Launch and exit: a torchrun script that never imports linkescape, clean
exits with and without destroy_process_group (also with an operation still
pending), and a process group inherited through fork()."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torchrun_linkescape.py")


def _clean(res, what):
    from linkescape.torch.testing import BAD_EXIT_MARKERS

    text = f"{what}: returncode={res.returncode}\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-5000:]}"
    assert not res.timed_out, text
    assert res.returncode == 0, text
    for marker in BAD_EXIT_MARKERS + ("Traceback",):
        assert marker not in res.stderr, text


def test_example_does_not_import_linkescape():
    with open(EXAMPLE) as f:
        src = f.read()
    assert "import linkescape" not in src and "from linkescape" not in src


@pytest.mark.parametrize("args,rails", [([], None), (["--no-destroy"], None),
                                        (["--no-destroy", "--leave-pending"], None),
                                        ([], "127.0.0.1,127.0.0.2")],
                         ids=["destroy", "no-destroy", "no-destroy-pending", "two-rails"])
def test_torchrun_without_import(args, rails):
    """The job runs and every rank exits at once after its last line: an exit
    that waited for something (a pending receive, the progress thread) would
    take the process group's 30 s timeout. Timed from the ranks' last line,
    not from the start, so a loaded machine's slow start-up is not counted."""
    import threading
    import types

    from linkescape.torch.testing import torchrun_popen

    p = torchrun_popen([EXAMPLE, *args], 2, env={"LINKESCAPE_RAILS": rails} if rails else None)
    out, oks, err = [], [], []
    drain = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    drain.start()
    try:
        for line in p.stdout:  # (the example flushes every line)
            out.append(line)
            oks += [time.monotonic()] * line.count(": ok")  # (two ranks' lines may come as one)
        p.wait(timeout=60)
        exited = time.monotonic()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    drain.join(timeout=10)
    res = types.SimpleNamespace(timed_out=False, returncode=p.returncode, stdout="".join(out),
                                stderr="".join(err))
    _clean(res, "torchrun")
    assert len(oks) == 2, res.stdout
    if rails:
        assert res.stdout.count(str(rails.split(","))) == 2, res.stdout
    assert exited - oks[-1] < 15, (exited - oks[-1], res.stderr[-3000:])


def test_autoload_can_be_disabled():
    """TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch does not load us; importing
    linkescape.torch registers the backend."""
    code = ("import torch.distributed as dist; a = 'LINKESCAPE' in dist.Backend._plugins; "
            "import linkescape.torch; print(a, 'LINKESCAPE' in dist.Backend._plugins)")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout
    out = subprocess.run([sys.executable, "-c", code.replace("TORCH", "")], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["True", "True"], (out.stdout, out.stderr)


def test_autoload_says_which_step_failed(monkeypatch, caplog):
    from linkescape.torch import backend

    # registered, then the process group's import fails: said as such, and the backend stays registered
    import linkescape.torch

    monkeypatch.setitem(sys.modules, "linkescape.torch.process_group", None)  # (an import of it fails)
    monkeypatch.delattr(linkescape.torch, "process_group", raising=False)
    with caplog.at_level("WARNING", logger="linkescape.torch"):
        backend._autoload()
    assert backend.is_registered()
    assert "could not import the process group" in caplog.text, caplog.text


def test_autoload_brings_the_process_group_so_init_imports_nothing():
    """The first init_process_group imported the process group's modules: a third of its CPU, and
    at 32 ranks on 2 cores what init waits for. ``import torch`` brings them now."""
    code = ("import sys, torch; print(sorted(m for m in ('linkescape.torch.process_group', "
            "'linkescape.torch.collectives', 'linkescape.comm.communicator') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(["linkescape.comm.communicator", "linkescape.torch.collectives",
                                      "linkescape.torch.process_group"]), (out.stdout, out.stderr)


def test_autoload_never_raises(monkeypatch):
    from linkescape.torch import backend

    def boom(*a, **k):
        raise RuntimeError("registration failed")

    monkeypatch.setattr(backend, "register", boom)
    backend._autoload()  # logs, does not raise


def fork_main():
    """Rank 0 forks after creating the group: the child must get a clear
    error and must not disturb the parent's links when it exits."""
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=20))
    from linkescape.torch import LinkEscapeBackendError

    r = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if r == 0:
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                dist.all_reduce(torch.ones(4))
            except LinkEscapeBackendError as exc:
                code = 0 if "fork" in str(exc) else 4
            sys.stdout.flush()
            sys.exit(code)  # normal exit: atexit handlers run in the child
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
    dist.barrier()
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.all(t == dist.get_world_size())
    print(f"rank {r}: ok", flush=True)
    # no destroy_process_group: the atexit handler closes the group


def test_fork_child_is_refused_and_parent_survives():
    from linkescape.torch.testing import failures, launch

    res = launch([os.path.abspath(__file__), "fork"], 2, timeout=60)
    bad = failures(res)
    assert not bad, bad
    for r in res:
        _clean(r, f"rank {r.rank}")
        assert f"rank {r.rank}: ok" in r.stdout


if __name__ == "__main__":
    {"fork": fork_main}[sys.argv[1]]()
