"""``load_shards`` on a world of one (FSDP2 over a one-rank mesh, Gloo): a commit loaded into
a freshly built model and optimizer gives them the committed state bit for bit, and they
then train as the model the commit was taken from. The common case is loaded in place
(``load_in_place``: no optimizer step on zero gradients, one copy); the others (buffers,
an optimizer state torch would nest) go through torch's ``set_state_dict``, to the same
result. Memory is written once: the parameters and the optimizer take the rows a reshard
made as they are, and a commit's own rows are copied into the memory of the round before
where it fits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from elasticjob.worker_runtime.elastic.sharded.shard_load import (
    StateCopies,
    load_in_place,
    load_shards,
    round_memory,
)
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (
    FLAT,
    ShardSnapshot,
    take_snapshot,
)

Built = tuple[torch.nn.Module, torch.optim.Optimizer]


@pytest.fixture
def mesh() -> Iterator[DeviceMesh]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def sharded(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    torch.manual_seed(0)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def mlp_adamw(mesh: DeviceMesh) -> Built:
    model = sharded(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)), mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def mlp_adamw_of_width(mesh: DeviceMesh, width: int) -> Built:
    layers = (torch.nn.Linear(6, width), torch.nn.Linear(width, 3))
    model = sharded(torch.nn.Sequential(*layers), mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def mlp_fused_adamw(mesh: DeviceMesh) -> Built:
    """Its kernel reads the step count on the parameters' device (a GPU's, on a GPU)."""
    model = sharded(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)), mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)


def mlp_sgd_two_groups(mesh: DeviceMesh) -> Built:
    model = sharded(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)), mesh)
    first, second = model[0], model[1]
    groups = [{"params": first.parameters(), "lr": 0.1}, {"params": second.parameters()}]
    return model, torch.optim.SGD(groups, lr=0.01, momentum=0.9)


def with_buffers(mesh: DeviceMesh) -> Built:
    layers = (torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 3))
    model = sharded(torch.nn.Sequential(*layers), mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train(built: Built, steps: int) -> None:
    model, optimizer = built
    for step in range(steps):
        x = torch.arange(24.0).reshape(4, 6) / (10 + step)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def snapshot(built: Built) -> ShardSnapshot:
    return take_snapshot(*built, shards=1, shard=0)


def equal(a: ShardSnapshot, b: ShardSnapshot) -> bool:
    def same(x: Any, y: Any) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else bool(x == y)

    return (
        a.sharded.keys() == b.sharded.keys()
        and all(torch.equal(a.sharded[k].local, b.sharded[k].local) for k in a.sharded)
        and a.replicated.keys() == b.replicated.keys()
        and all(same(v, b.replicated[k]) for k, v in a.replicated.items())
    )


def flat_states(built: Built) -> tuple[dict[str, Any], dict[str, Any]]:
    """The flat state dicts a commit is loaded from (no optimizer state before its first
    step: asking torch for it would step it)."""
    model, optimizer = built
    if not optimizer.state:
        return get_model_state_dict(model, options=FLAT), {}
    return get_state_dict(model, optimizer, options=FLAT)


def load(commit: ShardSnapshot, built: Built, mesh: DeviceMesh) -> None:
    shapes = {key: entry.shape for key, entry in commit.sharded.items()}
    locals_ = {key: entry.local.clone() for key, entry in commit.sharded.items()}
    load_shards(*built, mesh, shapes, locals_, commit.replicated)


@pytest.mark.parametrize(
    ("build", "steps", "in_place"),
    [
        (mlp_adamw, 2, True),
        (mlp_fused_adamw, 2, True),
        (mlp_sgd_two_groups, 2, True),
        (mlp_adamw, 0, True),  # committed before the optimizer's first step
        (with_buffers, 2, False),
    ],
    ids=["adamw", "fused-adamw", "sgd-two-groups", "not-started", "buffers"],
)
def test_a_loaded_commit_is_the_committed_state_and_trains_on_alike(
    mesh: DeviceMesh, build: Callable[[DeviceMesh], Built], steps: int, in_place: bool
) -> None:
    trained = build(mesh)
    train(trained, steps)
    for group in trained[1].param_groups:
        group["lr"] /= 2  # as a schedule would: the commit holds the new rates
    commit = snapshot(trained)
    fresh = build(mesh)
    train(fresh, 1)  # a live state to overwrite, not only a fresh one
    assert load_in_place(*build(mesh), *flat_states(trained)) is in_place
    load(commit, fresh, mesh)
    assert equal(snapshot(fresh), commit)
    train(trained, 2)
    train(fresh, 2)
    assert equal(snapshot(fresh), snapshot(trained))


@pytest.mark.parametrize("build", [mlp_adamw, with_buffers], ids=["in-place", "torch"])
def test_a_commit_loaded_without_copies_stays_as_it_was_while_the_model_trains(
    mesh: DeviceMesh, build: Callable[[DeviceMesh], Built]
) -> None:
    """A rank that keeps its shard loads its commit's own tensors (``borrowed``, not copied
    by the reshard): the model and optimizer get copies of them (the optimizer's on a thread
    of their own once started, which the state waits for before the optimizer steps), so the commit,
    committed again in the new round, is still the state to roll back to after more
    steps."""
    trained = build(mesh)
    train(trained, 2)
    commit, as_committed = snapshot(trained), snapshot(trained)
    fresh = build(mesh)
    shapes = {key: entry.shape for key, entry in commit.sharded.items()}
    locals_ = {key: entry.local for key, entry in commit.sharded.items()}
    copies = load_shards(
        *fresh, mesh, shapes, locals_, commit.replicated, borrowed=commit.sharded.keys()
    )
    copies.wait()
    assert equal(snapshot(fresh), commit)
    train(fresh, 2)
    assert not equal(snapshot(fresh), commit), "the model trained on"
    assert equal(commit, as_committed)


def pointers(built: Built) -> dict[tuple[str, str], int]:
    """Where the model's shards and its optimizer's state live, by snapshot entry."""
    return {key: tensor.data_ptr() for key, tensor in round_memory(*built).items()}


def test_the_parameters_and_the_optimizer_take_the_rows_made_for_them(mesh: DeviceMesh) -> None:
    """Rows a reshard assembled for this rank are nobody else's: no copy of them is made,
    and FSDP2 gathers the parameters from them (the model trains on as the one the commit
    was taken from)."""
    trained = mlp_adamw(mesh)
    train(trained, 2)
    commit = snapshot(trained)
    fresh = mlp_adamw(mesh)
    shapes = {key: entry.shape for key, entry in commit.sharded.items()}
    locals_ = {key: entry.local.clone() for key, entry in commit.sharded.items()}
    load_shards(*fresh, mesh, shapes, locals_, commit.replicated)
    assert pointers(fresh) == {key: local.data_ptr() for key, local in locals_.items()}
    train(trained, 2)
    train(fresh, 2)
    assert equal(snapshot(fresh), snapshot(trained))


@pytest.mark.parametrize("width", [5, 4], ids=["same-shards", "other-shapes"])
def test_a_commit_kept_by_its_rank_is_copied_into_the_memory_of_the_round_before(
    mesh: DeviceMesh, width: int
) -> None:
    """A rank that keeps its shard copies its commit (borrowed: the commit's own tensors)
    into its model's and optimizer's memory of the round before, which went on past the
    commit; memory of another shape is not used. Either way the model holds the commit,
    trains on as a model loaded from copies of it, and the commit stays as it was."""
    trained = mlp_adamw(mesh)
    train(trained, 2)
    commit, as_committed = snapshot(trained), snapshot(trained)
    before = trained if width == 5 else mlp_adamw_of_width(mesh, width)
    train(before, 1)
    spare = round_memory(*before)
    fresh = mlp_adamw(mesh)
    shapes = {key: entry.shape for key, entry in commit.sharded.items()}
    locals_ = {key: entry.local for key, entry in commit.sharded.items()}
    load_shards(
        *fresh, mesh, shapes, locals_, commit.replicated, commit.sharded.keys(), spare
    ).wait()
    reused = {key for key, at in pointers(fresh).items() if at == spare[key].data_ptr()}
    fitting = {key for key, e in commit.sharded.items() if spare[key].shape == e.local.shape}
    assert reused == fitting
    assert len(fitting) == (12 if width == 5 else 3)  # else only the last bias and its state
    assert equal(snapshot(fresh), commit)
    reference = mlp_adamw(mesh)
    load(commit, reference, mesh)
    train(fresh, 2)
    train(reference, 2)
    assert equal(snapshot(fresh), snapshot(reference))
    assert equal(commit, as_committed)


def test_state_copies_are_made_on_their_thread_or_by_wait_and_a_failure_is_raised_by_wait() -> None:
    into, source = torch.zeros(3), torch.arange(3.0)
    started = StateCopies([(into, source)])
    started.start()
    started.wait()
    assert torch.equal(into, source)
    started.wait()  # again: nothing left to wait for

    inline, later = torch.zeros(3), torch.zeros(3)
    StateCopies([(inline, source)]).wait()  # not started: made by wait
    assert torch.equal(inline, source)
    failing = StateCopies([(later, source), (torch.zeros(2), source)])
    failing.start()
    with pytest.raises(RuntimeError, match="copying the committed optimizer state failed"):
        failing.wait()
