"""``init_process_group("linkescape")`` returns only once every rank is
connected, as Gloo's eager connect does: code relies on it (an RPC sent
right after init reached a rank still inside its init_process_group).

Rank 1 is made slow after its communicator is up (it sleeps, then marks the
store); rank 0, the moment its init_process_group returns, must already see
the mark. Without the barrier at the end of init it returns about a second
early.
"""

from __future__ import annotations

import datetime
import os
import time

import torch.distributed as dist

SLOW_S = 1.5


def main():
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), n, r == 0,
                          timeout=datetime.timedelta(seconds=30))
    if r == 1:
        import linkescape.torch.process_group as pgmod

        class SlowCommunicator(pgmod.Communicator):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                time.sleep(SLOW_S)  # links up, but this rank still inside init_process_group
                store.set("rank1_constructed", "1")

        pgmod.Communicator = SlowCommunicator
    dist.init_process_group("linkescape", store=store, rank=r, world_size=n,
                            timeout=datetime.timedelta(seconds=30))
    if r == 0:
        assert store.check(["rank1_constructed"]), "init_process_group returned before rank 1 was connected"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: ok", flush=True)


def test_init_returns_once_every_rank_is_connected():
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], 3, timeout=90)


if __name__ == "__main__":
    main()
