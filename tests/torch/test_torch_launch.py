"""The multi-rank launcher of the torch tests (linkescape.torch.testing.launch):
forked ranks behave as spawned ones -- their own environment, output, exit
status and random draws, an exception or a signal reported as a fresh
interpreter would."""

from __future__ import annotations

import pytest

from linkescape.torch.testing import launch

SCRIPT = """
import os, sys, numpy, torch.distributed
rank = int(os.environ["RANK"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} x={os.environ.get('X')} "
      f"argv={sys.argv[1:]} main={__name__} draw={numpy.random.randint(1 << 62)}")
if rank == 1:
    raise ValueError("rank one fails")
if rank == 2:
    os.kill(os.getpid(), 9)
import atexit
atexit.register(lambda: print("atexit ran", flush=True))
sys.exit(3 if rank == 3 else 0)
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_ranks_get_their_environment_output_and_exit_status(start):
    res = launch(["-c", SCRIPT, "a", "b"], 4, env={"X": "job"}, per_rank_env={0: {"LOCAL_RANK": "7"}},
                 timeout=60, start=start)
    assert [r.returncode for r in res] == [0, 1, -9, 3], [r.describe() for r in res]
    assert "rank 0 of 4 local 7 x=job argv=['a', 'b'] main=__main__" in res[0].stdout
    assert "rank 3 of 4 local 3" in res[3].stdout and "atexit ran" in res[3].stdout
    assert "ValueError: rank one fails" in res[1].stderr and "rank 1 of 4" in res[1].stdout
    assert all(not r.timed_out for r in res)
    # numpy's global generator is seeded afresh in every rank, as in a fresh process
    draws = {r.stdout.split("draw=")[1].split()[0] for r in res if "draw=" in r.stdout}
    assert len(draws) == 4, [r.stdout for r in res]


def test_a_rank_that_hangs_is_killed_at_the_timeout():
    # The timeout counts from the launcher's start, torch's import included: 8 s was once too short for
    # rank 0 too (make test on a fresh machine, a wheel's install beside it). 20 s; the hang is 600.
    res = launch(["-c", "import os, time\nif os.environ['RANK'] == '1': time.sleep(600)"], 2, timeout=20)
    assert res[0].returncode == 0 and not res[0].timed_out
    assert res[1].timed_out


def test_a_reserved_port_is_given_to_no_other_socket_yet_a_store_listens_on_it():
    # CI of stop 56: a rank 0's TCPStore failed with EADDRINUSE on the port free_port had found free,
    # taken in between by a listener of a test running beside it (a bind to port 0 of its own).
    import datetime
    import errno
    import socket

    import torch.distributed as dist

    from linkescape.torch.testing import reserved_port

    with reserved_port() as port:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # held: the kernel gives it no one else
            with pytest.raises(OSError) as exc:
                s.bind(("127.0.0.1", port))
            assert exc.value.errno == errno.EADDRINUSE
        store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10))
        store.set("k", "v")
        assert store.get("k") == b"v"
        del store
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # given back: a plain bind gets it
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_job_listens_on_the_port_it_was_given_while_the_launch_holds_it():
    script = ("import errno, os, socket\n"
              "port = int(os.environ['MASTER_PORT'])\n"
              "plain = socket.socket()\n"
              "try:\n"
              "    plain.bind(('127.0.0.1', port))\n"
              "    print('rank 0: not held')\n"
              "except OSError as exc:\n"
              "    print('rank 0: held' if exc.errno == errno.EADDRINUSE else f'rank 0: {exc}')\n"
              "s = socket.create_server(('127.0.0.1', port))\n"
              "print('rank 0: listening')")
    res = launch(["-c", script], 1, timeout=60)
    assert res[0].returncode == 0, res[0].describe()
    assert "rank 0: held" in res[0].stdout and "rank 0: listening" in res[0].stdout, res[0].describe()
