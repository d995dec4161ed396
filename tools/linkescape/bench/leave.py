"""How a benchmark's rank process ends: at once, without the interpreter's finalization.

A rank has imported torch (and numpy, and its backends); finalizing such an interpreter (the
cycle collector's passes over every module's objects, then their deallocation) costs 0.3-0.5 s
of CPU here (`/usr/bin/time python -c "import torch, torch.distributed, numpy, linkescape.torch"`
against the same with ``os._exit(0)``: 1.4-1.6 s against 1.1-1.2 s of user time). 64 ranks that
end together on 2 cores took longer than the launcher's grace after the run's end
(``runner.WATCHDOG_GRACE``, 15 s), and a run whose every row was measured ended in an error. A
rank has closed its backends and said it is done before it gets here; what is left to do is what
``atexit`` holds (the torch backend's ``close_all``, mpi4py's finalize) and the output's buffers.

Cost: O(1) per rank, whatever N."""

from __future__ import annotations

import atexit
import os
import sys


def leave(rc: int) -> None:
    """End this process with exit status ``rc``: the ``atexit`` handlers, the output flushed,
    then ``os._exit`` (no finalization)."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(rc)


__all__ = ["leave"]
