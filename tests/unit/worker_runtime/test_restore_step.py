"""``restore()`` brings the runtime's step count back to the commit's, for every kind of state:
``elastic.run`` compares the ranks' commit tokens together with their step counts to skip the
sync after a rollback, and a rank's progress reports and checkpoint names carry the count, so
after a rollback it must count the steps of the state it rolled back to, not the ones undone.
Standalone runtime (a world of one); the sharded state over a real FSDP2 model."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.elastic import ObjectState, ShardedState, State, TorchState

pytestmark = pytest.mark.usefixtures("runtime_group")  # the standalone runtime


def build(mesh: DeviceMesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def object_state() -> tuple[State, Callable[[], None]]:
    state = ObjectState(batch=0)

    def step() -> None:
        basics.current().count_step()
        state.batch += 1

    return state, step


def torch_state() -> tuple[State, Callable[[], None]]:
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = TorchState(model, optimizer, batch=0)

    def step() -> None:  # the DistributedOptimizer counts its steps
        optimizer.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        state.batch += 1

    return state, step


def sharded_state() -> tuple[State, Callable[[], None]]:
    state = ShardedState(build, redundancy=0, batch=0)
    state.sync()  # what elastic.run does first: build the model over the round's world

    def step() -> None:  # the state counts its optimizer's steps
        assert state.model is not None and state.optimizer is not None
        state.model(torch.ones(3, 4)).sum().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.batch += 1

    return state, step


@pytest.mark.parametrize("make", [object_state, torch_state, sharded_state])
def test_restore_brings_the_step_count_back_to_the_commits(
    make: Callable[[], tuple[State, Callable[[], None]]],
) -> None:
    runtime = basics.current()
    state, step = make()
    for _ in range(2):
        step()
    state.commit()
    committed = (runtime.step, state.batch)  # type: ignore[attr-defined]
    for _ in range(3):
        step()
    assert runtime.step == committed[0] + 3
    state.restore()
    assert (runtime.step, state.batch) == committed  # type: ignore[attr-defined]
