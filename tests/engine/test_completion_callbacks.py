"""A waiter outside the engine lock sees an operation complete only once its completion
callbacks have run: the library marks an operation done and then runs them (the finish steps
that write the caller's buffers among them: AVG's division, copies out of staging), on the
progress thread when it completed there. ``Work.wait``/``is_completed``/``done_within`` used
to trust ``done`` alone, so an async op could be read before its finish step ran."""

from __future__ import annotations

import threading
import time

import numpy as np

from linkescape import Communicator, FileStore
from linkescape.communicator import Work
from linkescape.engine.messages import Op


def test_a_waiter_sees_the_buffer_only_after_the_callbacks(tmp_path):
    with Communicator(FileStore(str(tmp_path / "s")), 0, 1) as comm:
        buf = np.zeros(4, np.float32)
        op = Op(1, "all_reduce", time.monotonic() + 60)

        def finish(_op):
            time.sleep(0.3)  # the progress thread runs the finish step (descheduled a while)
            buf[:] = 7.0

        op.callbacks.append(finish)
        work = Work(comm, op)
        started = threading.Event()

        def complete_on_the_progress_thread():
            with comm._driver.locked() as engine:
                started.set()
                engine.ops.complete(op)  # done = True, then the callbacks, under the lock

        t = threading.Thread(target=complete_on_the_progress_thread)
        t.start()
        started.wait(5)
        while not op.done:
            time.sleep(0.001)
        assert not work.is_completed()  # done, but its finish step still runs
        assert work.wait(timeout=10) is True
        assert work.is_completed() and op.finished
        assert (buf == 7.0).all()
        t.join(5)


def test_a_callback_waiting_on_its_own_operation_is_not_timed_out(tmp_path):
    """Inside the callbacks the operation is done but not finished: a callback that waits on it (on
    the thread that runs them) gets True, as before ``finished`` existed."""
    with Communicator(FileStore(str(tmp_path / "s")), 0, 1) as comm:
        op = Op(1, "all_reduce", time.monotonic() + 60)
        work = Work(comm, op)
        seen = []
        op.callbacks.append(lambda _op: seen.append(work.wait(timeout=1)))
        with comm._driver.locked() as engine:
            engine.ops.complete(op)
        assert seen == [True] and work.is_completed()
