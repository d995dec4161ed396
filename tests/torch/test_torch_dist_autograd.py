"""DDP over linkescape beside RPC and distributed autograd, as torch's own
``DdpComparisonTest`` does it with Gloo: ``dist_autograd.backward`` through
a DDP model, then a local ``loss.backward()``; both must finish (they used
to hang) and give the same gradients. Also sparse gradients
(``nn.EmbeddingBag(sparse=True)``) and a remote first layer
(``RemoteModule`` on rank 0).
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

T = datetime.timedelta(seconds=60)


def _get_remote_grads(rref, context_id):
    return dist_autograd.get_gradients(context_id)[rref.local_value().weight]


def ddp_comparison(r, uneven):
    torch.manual_seed(r)
    net = nn.Linear(2, 3)
    ddp_net = DDP(net)
    inputs_list = [torch.rand((3, 2)) for _ in range(1 + (2 if uneven and r % 2 == 0 else 0))]
    with ddp_net.join(uneven):
        for i, inputs in enumerate(inputs_list):
            with dist_autograd.context() as context_id:
                loss = ddp_net(inputs).norm()
                dist_autograd.backward(context_id, [loss])
                grads = dist_autograd.get_gradients(context_id)
            ddp_net.zero_grad()
            loss = ddp_net(inputs).norm()
            loss.backward()
            for p in net.parameters():
                assert p in grads, f"iteration {i}: a parameter is missing from the dist_autograd gradients"
                assert torch.allclose(grads[p], p.grad), f"iteration {i}: {grads[p]} != {p.grad}"


def sparse_grads(r):
    torch.manual_seed(r)
    model = nn.EmbeddingBag(10, 3, sparse=True)
    ddp_model = DDP(model)
    inp = torch.LongTensor(10).random_(0, 10)
    offsets = torch.LongTensor([0, 4])
    ddp_model(inp, offsets).sum().backward()
    with dist_autograd.context() as context_id:
        loss = ddp_model(inp, offsets).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
        assert len(grads) == 1
        assert torch.allclose(model.weight.grad.to_dense(), grads[model.weight].to_dense())


def local_vs_remote(r):
    from torch.distributed.nn import RemoteModule

    torch.manual_seed(r)
    for remote_device in ["worker0/cpu", "worker0"]:
        remote_layer1 = RemoteModule(remote_device=remote_device, module_cls=nn.Linear, args=(10, 5, False))
        layer1 = nn.Linear(10, 5, False)
        layer1.weight = remote_layer1.module_rref.to_here().weight
        layer2 = nn.Linear(5, 1)
        inputs = torch.rand((10, 10))
        ddp_model = DDP(layer2)
        ddp_model(layer1(inputs)).sum().backward()
        with dist_autograd.context() as context_id:
            loss = ddp_model(remote_layer1(inputs)).sum()
            dist_autograd.backward(context_id, [loss])
            grads = dist_autograd.get_gradients(context_id)
            dist.barrier()
            assert torch.allclose(layer2.weight.grad, grads[layer2.weight])
            remote = rpc.rpc_sync("worker0", _get_remote_grads, args=(remote_layer1.module_rref, context_id))
            assert torch.allclose(layer1.weight.grad, remote)


def main():
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # the process group first: when it returns every rank is connected, so
    # RPC traffic never reaches a rank still in init_process_group
    dist.init_process_group("linkescape", timeout=T)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{os.environ['RPC_PORT']}",
                                           rpc_timeout=60)
    rpc.init_rpc(f"worker{r}", rank=r, world_size=n, rpc_backend_options=opts)
    ddp_comparison(r, uneven=False)
    ddp_comparison(r, uneven=True)
    sparse_grads(r)
    local_vs_remote(r)
    rpc.shutdown()
    dist.destroy_process_group()
    print(f"rank {r}: ok", flush=True)


def test_ddp_under_distributed_autograd():
    from linkescape.torch.testing import launch_ok, reserved_port

    with reserved_port() as rpc_port:
        launch_ok([os.path.abspath(__file__)], 2, timeout=180, env={"RPC_PORT": str(rpc_port)})


if __name__ == "__main__":
    main()
