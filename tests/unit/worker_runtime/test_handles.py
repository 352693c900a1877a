"""Async handles in a standalone world of one (a real Gloo group in this process): results
come back through ``synchronize``; a handle whose round broke, or was replaced by a newer
round, raises ``HorovodInternalError`` at once instead of waiting; ``poll`` never blocks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from tests.support.worker_env import standalone_env


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    standalone_env(monkeypatch)
    hvd.init()
    yield
    hvd.shutdown()


def test_synchronize_returns_the_output_once(world_of_one: None) -> None:
    handle = hvd.allreduce_async(torch.tensor([2.0, 4.0]), op=hvd.Sum)
    assert isinstance(handle, int)
    assert hvd.synchronize(handle).tolist() == [2.0, 4.0]
    assert hvd.synchronize(handle) is None
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.poll(handle)


def test_a_handle_of_a_broken_round_raises_at_once(world_of_one: None) -> None:
    handle = hvd.broadcast_async(torch.ones(3), root_rank=0)
    basics.current().group.abort("a member of round 1 failed (test)")
    assert hvd.poll(handle) is True, "synchronize would not block: it raises"
    with pytest.raises(hvd.HorovodInternalError, match="round 1 failed"):
        hvd.synchronize(handle)


def test_a_handle_of_an_earlier_round_raises(world_of_one: None) -> None:
    tensors = [torch.ones(2), torch.zeros(1, dtype=torch.int64)]
    handle = hvd.grouped_allreduce_async(tensors)
    forgotten = hvd.allreduce_async(torch.ones(2))
    basics.current().reset()
    with pytest.raises(hvd.HorovodInternalError, match="issued in round 1"):
        hvd.synchronize(handle)
    fresh = hvd.allgather_async(torch.ones(2, 1))  # lets the earlier round's buffers go
    assert hvd.poll(forgotten) is True
    with pytest.raises(hvd.HorovodInternalError, match="issued in round 1"):
        hvd.synchronize(forgotten)
    assert hvd.synchronize(forgotten) is None
    assert hvd.synchronize(fresh).shape == (2, 1)


def test_adasum_and_unusable_process_sets_are_refused_by_name(world_of_one: None) -> None:
    with pytest.raises(NotImplementedError, match=r"op=hvd\.Average"):
        hvd.grouped_allreduce([torch.ones(1)], op=hvd.Adasum)
    with pytest.raises(ValueError, match="not registered in this round"):
        hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="distinct ranks of the round"):
        hvd.add_process_set([0, 1])
    with pytest.raises(ValueError, match="not a ProcessSet"):
        hvd.barrier(process_set="ranks 0 and 1")  # type: ignore[arg-type]


def test_a_name_in_progress_is_refused_until_its_call_is_carried_out(world_of_one: None) -> None:
    first = hvd.allreduce_async(torch.ones(1), name="loss")
    assert hvd.synchronize(first).tolist() == [1.0]
    again = hvd.allreduce_async(torch.ones(1), name="loss")  # carried out: the name is free
    assert hvd.synchronize(again).tolist() == [1.0]


def test_horovods_checks_of_named_parameters_and_optimizer_state(world_of_one: None) -> None:
    model = torch.nn.Linear(2, 2)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match=r"must be unique\. Found duplicates: bias, weight"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named * 2)
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named[:1])
    unnamed = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert sorted(unnamed._parameter_names.values()) == [  # type: ignore[attr-defined]
        "allreduce.noname.0.0",
        "allreduce.noname.0.1",
    ]
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    weights = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    assert len(fresh.state_dict()["state"]) == 2, "a fresh optimizer's state is made first"
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))


def test_a_fresh_distributed_optimizers_state_is_made_by_the_wrapped_step(
    world_of_one: None,
) -> None:
    """Horovod makes a fresh optimizer's state with one step of the optimizer it wraps: the
    ``DistributedOptimizer``'s own step would reduce the zero gradients and count a step."""
    model = torch.nn.Linear(2, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert len(optimizer.state_dict()["state"]) == 2
    assert optimizer._ej_reducer.reductions == 0  # type: ignore[attr-defined]
