"""One replica group of the torchft training run: a torchft Manager, a small model, gradients averaged
with ``manager.allreduce``.

Run once per testbed host by :mod:`linkescape.torchft.run` (``python -m linkescape.torchft.train``).
The replica trains until torchft's step reaches ``--steps`` (or the step written into ``--stop-file``),
paced to at most one step per ``--pace`` seconds, and writes under ``--out``:

* ``steps-r{replica}.jsonl``: one line per step: ``t`` (wall time at its end), ``step`` (torchft's
  step after it), ``committed`` (whether torchft committed it), ``quorum_id``, ``participants``,
  ``healing`` (this replica recovered the state of another in it), and ``error`` when the step failed;
* ``final-r{replica}.json``: the final step and the parameters' SHA-256.

Two pitfalls of torchft 0.2.0 with torch 2.13 are avoided here: torchft's DDP wrapper asserts once the
Manager has errored (``assert fut._fut``), so the gradients are averaged with ``manager.allreduce``;
torchft's checkpoint transport advertises ``socket.gethostname()``, which in a testbed host names the
machine, so the replica advertises its management address instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="linkescape.torchft.train", description=__doc__.splitlines()[0])
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--backend", choices=("linkescape", "gloo"), default="linkescape")
    p.add_argument("--lighthouse", required=True, help="the lighthouse's address, http://HOST:PORT")
    p.add_argument("--addr", required=True, help="this host's management address (stores, checkpoints)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=100000, help="stop at this torchft step")
    p.add_argument("--stop-file", default=None,
                   help="a file that, once written, holds the step to stop at (every replica stops at the same one)")
    p.add_argument("--pace", type=float, default=0.2, help="seconds a step takes at least")
    p.add_argument("--timeout", type=float, default=10.0, help="torchft's timeouts, seconds")
    p.add_argument("--quorum-timeout", type=float, default=30.0, help="torchft's quorum timeout, seconds")
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _safe(fn):
    """``fn()``, or None where it raises (a quorum that failed raises again when asked)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    # torchft's checkpoint transport and manager advertise the host name: here, the management address
    socket.gethostname = lambda: args.addr  # type: ignore[assignment]
    import torch
    from torch.distributed import TCPStore
    from torchft import Manager

    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    r = args.replica
    log = open(os.path.join(args.out, f"steps-r{r}.jsonl"), "a", buffering=1)
    timeout = timedelta(seconds=args.timeout)
    if args.backend == "gloo":
        from torchft.process_group import ProcessGroupGloo

        pg = ProcessGroupGloo(timeout=timeout)
    else:
        from . import ProcessGroupLinkescape

        pg = ProcessGroupLinkescape(timeout=timeout)
    model = _model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    store = TCPStore(args.addr, 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=pg, min_replica_size=args.min_replicas, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"replica{r}", store_addr=args.addr, store_port=store.port,
                      rank=0, world_size=1, lighthouse_addr=args.lighthouse, hostname=args.addr, port=0,
                      timeout=timeout, quorum_timeout=timedelta(seconds=args.quorum_timeout), connect_timeout=timeout,
                      quorum_retries=1000)
    gen = torch.Generator().manual_seed(args.seed + 1000 * r)
    teacher = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(64, 10, generator=teacher)
    params = list(model.parameters())
    log.write(json.dumps({"start": time.time(), "replica": r, "backend": args.backend, "pid": os.getpid()}) + "\n")
    try:
        target = args.steps
        while manager.current_step() < target:
            t0 = time.time()
            rec = {}
            try:
                manager.start_quorum()
                opt.zero_grad()
                x = torch.randn(32, 64, generator=gen)
                y = (x @ w_true).argmax(dim=1)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                manager.allreduce(flat).wait()  # the average over the participating replicas
                off = 0
                for p in params:
                    n = p.numel()
                    p.grad.copy_(flat[off:off + n].view_as(p))
                    off += n
                committed = bool(manager.should_commit())
                if committed:
                    opt.step()
                rec = {"committed": committed, "loss": float(loss)}
            except Exception as exc:  # noqa: BLE001 - the step is lost, training goes on
                rec = {"committed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                time.sleep(0.2)
            rec.update(t=time.time(), step=manager.current_step(), quorum_id=manager._quorum_id,
                       participants=_safe(manager.num_participants), healing=bool(manager._healing),
                       configure=getattr(pg, "last_configure", None))
            log.write(json.dumps(rec) + "\n")
            if args.stop_file and os.path.exists(args.stop_file):
                try:
                    with open(args.stop_file) as f:
                        target = min(target, int(f.read().strip()))
                except ValueError:
                    pass  # being written
            left = args.pace - (time.time() - t0)
            if left > 0:
                time.sleep(left)
        final = {"replica": r, "step": manager.current_step(), "params_sha256": _digest(model), "end": time.time()}
        with open(os.path.join(args.out, f"final-r{r}.json"), "w") as f:
            json.dump(final, f)
        return 0
    except BaseException:
        with open(os.path.join(args.out, f"error-r{r}.txt"), "w") as f:
            f.write(traceback.format_exc())
        return 1
    finally:
        manager.shutdown(wait=False)
        log.close()


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
