"""``release_group``: once a sharded model ran, FSDP2 keeps it reachable (from outside
Python's collector), so its references to the process group are cut explicitly; afterwards
nothing of the model or its device mesh holds the group."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import release_group


@pytest.fixture
def world_of_one() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


def test_a_released_model_and_mesh_hold_no_reference_to_the_group(
    world_of_one: dist.ProcessGroup,
) -> None:
    held_by_torch = sys.getrefcount(world_of_one)
    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.ones(2, 4)).sum().backward()
    assert sys.getrefcount(world_of_one) > held_by_torch

    release_group(model, mesh)
    del model, mesh
    gc.collect()
    assert sys.getrefcount(world_of_one) == held_by_torch
