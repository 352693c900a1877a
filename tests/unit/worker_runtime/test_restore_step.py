"""``restore()`` brings the runtime's step count back to the commit's, for every kind of state:
``elastic.run`` compares the ranks' commit tokens together with their step counts to skip the
sync after a rollback, and a rank's progress reports and checkpoint names carry the count, so
after a rollback it must count the steps of the state it rolled back to, not the ones undone.
A sharded state whose rank keeps its shard in the next round then loads its commit into the
memory of the round before and copies the optimizer's state beside the first step, which
waits for it: training goes on exactly as from the commit. Standalone runtime (a world of
one); the sharded state over a real FSDP2 model."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.elastic import ObjectState, ShardedState, State, TorchState
from elasticjob.worker_runtime.elastic.sharded import shard_load
from elasticjob.worker_runtime.elastic.sharded.shard_load import round_memory
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardSnapshot, take_snapshot

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


def sharded_step(state: ShardedState, batch: int) -> None:
    assert state.model is not None and state.optimizer is not None
    state.model(torch.full((3, 4), float(batch))).pow(2).sum().backward()
    state.optimizer.step()
    state.optimizer.zero_grad()


def snapshot(state: ShardedState) -> ShardSnapshot:
    assert state.model is not None and state.optimizer is not None
    return take_snapshot(state.model, state.optimizer, 1, 0)


def same(a: ShardSnapshot, b: ShardSnapshot) -> bool:
    return a.sharded.keys() == b.sharded.keys() and all(
        torch.equal(a.sharded[key].local, b.sharded[key].local) for key in a.sharded
    )


def test_a_kept_shard_resumes_in_the_rounds_memory_and_its_step_waits_for_the_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = basics.current()
    straight = ShardedState(build, redundancy=0)
    straight.sync()
    for batch in (1, 2, 3):
        sharded_step(straight, batch)
    expected = snapshot(straight)  # 2 steps, and the third from the state after them

    state = ShardedState(build, redundancy=0)
    state.sync()
    for batch in (1, 2):
        sharded_step(state, batch)
    state.commit()
    state.wait_for_commit()
    sharded_step(state, 7)  # past the commit: rolled back
    assert state.model is not None and state.optimizer is not None
    before = {key: t.data_ptr() for key, t in round_memory(state.model, state.optimizer).items()}
    # Copies made only when waited for: the optimizer's step must wait, or it steps from the
    # round before's state.
    monkeypatch.setattr(shard_load.StateCopies, "start", lambda self: None)
    state.restore()
    runtime.reset(rolled_back=True)
    state.sync()
    assert state.model is not None and state.optimizer is not None
    after = round_memory(state.model, state.optimizer)
    assert {key: t.data_ptr() for key, t in after.items()} == before
    sharded_step(state, 3)
    assert same(snapshot(state), expected)
    assert state.state_copy_wait_s > 0
