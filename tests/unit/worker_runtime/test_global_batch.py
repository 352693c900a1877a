"""Tests of the fixed global batch: the pure plan of one global batch over a world
(``batch_plan``), and the batch sampler that deals an epoch in global batches across resizes
(``global_batch``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from elasticjob.worker_runtime.elastic.batch_plan import MicroBatch, plan_step, step_sizes
from elasticjob.worker_runtime.elastic.global_batch import GlobalBatchSampler, accumulate
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from tests.support.fixed_rank import FixedRank


@pytest.mark.parametrize(
    ("samples", "micro", "world", "accumulation", "sizes"),
    [
        # even: W * M * A == G, every micro-batch full
        (24, 4, 3, 2, [(4, 4), (4, 4), (4, 4)]),
        # one micro-batch holds a rank's whole share
        (12, 8, 3, 1, [(4,), (4,), (4,)]),
        # uneven world: the first G mod W ranks have one more sample
        (10, 2, 3, 2, [(2, 2), (2, 1), (2, 1)]),
        # a share dealt over the micro-batches as evenly as possible, larger first
        (20, 4, 3, 2, [(4, 3), (4, 3), (3, 3)]),
        (256, 32, 3, 3, [(29, 29, 28), (29, 28, 28), (29, 28, 28)]),
        # one rank
        (7, 3, 1, 3, [(3, 2, 2)]),
        # more ranks than samples: empty micro-batches (a padding sample each)
        (2, 4, 3, 1, [(1,), (1,), (0,)]),
        # the last, short global batch of an epoch
        (5, 4, 4, 1, [(2,), (1,), (1,), (1,)]),
    ],
)
def test_plan_step(
    samples: int, micro: int, world: int, accumulation: int, sizes: list[tuple[int, ...]]
) -> None:
    plan = plan_step(samples, micro, world)
    assert plan.accumulation == accumulation
    assert [plan.micro_sizes(rank) for rank in range(world)] == sizes
    # every position of the global batch exactly once, no micro-batch over the limit
    positions = [
        p
        for r in range(world)
        for micro_batch, size in zip(plan.positions(r), sizes[r], strict=True)
        for p in micro_batch[:size]
    ]
    assert sorted(positions) == list(range(samples))
    assert all(len(mb) <= micro for r in range(world) for mb in plan.positions(r))
    # the loss scales make the rank-averaged accumulated gradient the global batch's mean:
    # every real sample's gradient enters with the weight world / samples, padding with none
    for rank in range(world):
        for micro_batch in plan.micro_batches(0, rank):
            per_sample = micro_batch.loss_scale / micro_batch.size if micro_batch.size else 0.0
            assert per_sample == pytest.approx(world / samples if micro_batch.size else 0.0)


def test_an_even_plan_scales_the_loss_as_plain_accumulation_does() -> None:
    plan = plan_step(24, 4, 3)
    assert {m.loss_scale for r in range(3) for m in plan.micro_batches(5, r)} == {0.5}
    first, last = plan.micro_batches(5, 1)
    assert (first.step, first.first, first.last, last.last, last.count) == (5, True, False, True, 2)


def test_an_empty_micro_batch_trains_one_padding_sample_with_no_weight() -> None:
    plan = plan_step(2, 4, 3)
    assert plan.positions(2) == [[0]]
    assert plan.micro_batches(0, 2) == [MicroBatch(0, 0, 1, 0, 0.0)]


@pytest.mark.parametrize(("samples", "micro", "world"), [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_plan_step_rejects_non_positive_arguments(samples: int, micro: int, world: int) -> None:
    with pytest.raises(ValueError, match="global batch plan"):
        plan_step(samples, micro, world)


@pytest.mark.parametrize(
    ("remaining", "global_batch", "sizes"),
    [(96, 24, [24] * 4), (96, 20, [20, 20, 20, 20, 16]), (5, 20, [5]), (0, 20, [])],
)
def test_step_sizes(remaining: int, global_batch: int, sizes: list[int]) -> None:
    assert step_sizes(remaining, global_batch) == sizes


def world_of(length: int, size: int, global_batch: int, micro: int) -> list[GlobalBatchSampler]:
    return [
        GlobalBatchSampler(
            range(length), global_batch, micro, seed=3, rank_and_size=FixedRank(r, size)
        )
        for r in range(size)
    ]


def train_steps(samplers: list[GlobalBatchSampler], steps: int) -> list[list[int]]:
    """Every rank trains its micro-batches of ``steps`` global batches: the samples of each
    global batch (padding excluded), sorted."""
    passes = [list(sampler) for sampler in samplers]
    trained: list[list[int]] = []
    for step in range(steps):
        samples: list[int] = []
        for sampler, micro_batches in zip(samplers, passes, strict=True):
            for i, indices in enumerate(micro_batches):
                micro = sampler.micro_batch(i)
                if micro.step == sampler.micro_batch(0).step + step:
                    samples += indices[: micro.size]
        trained.append(sorted(samples))
        for sampler in samplers:
            sampler.record_step()
    return trained


def test_a_global_batch_is_the_same_samples_at_every_world_size() -> None:
    order = GlobalBatchSampler(range(96), 20, 4, seed=3, rank_and_size=FixedRank(0, 1))
    expected = [sorted(order._order[s * 20 : (s + 1) * 20]) for s in range(5)]
    for size in (1, 2, 3, 4, 7, 25):
        assert train_steps(world_of(96, size, 20, 4), 5) == expected, size


def test_resizes_mid_epoch_keep_the_global_batches_and_train_every_sample_once() -> None:
    samplers = world_of(96, 3, 20, 4)
    uninterrupted = train_steps(world_of(96, 1, 20, 4), 5)
    trained = train_steps(samplers, 2)
    assert samplers[0].processed_num == 40
    # a scale-out to 4, then a failure that leaves 2: survivors keep their progress
    state = samplers[0].state_dict()
    grown = world_of(96, 4, 20, 4)
    for sampler in grown:
        sampler.load_state_dict(state)
    trained += train_steps(grown, 1)
    for rank, sampler in enumerate(grown[:2]):
        sampler._rank_and_size = FixedRank(rank, 2)
        sampler.reset()
    trained += train_steps(grown[:2], 2)
    assert trained == uninterrupted
    assert sorted(i for batch in trained for i in batch) == list(range(96))
    assert grown[0].steps_left == 0 and grown[0].processed_num == 96


def test_a_global_batch_cut_short_by_a_reset_is_trained_again_from_its_start() -> None:
    sampler = world_of(40, 2, 20, 4)[0]
    first_pass = list(sampler)
    assert sampler.accumulation_steps == 3 and sampler.micro_batch(0).count == 3
    sampler._rank_and_size = FixedRank(0, 4)
    sampler.reset()
    assert sampler.processed_num == 0 and sampler.accumulation_steps == 2
    # the global batch starts over, planned for the new world
    assert list(sampler) == list(world_of(40, 4, 20, 4)[0])
    assert sampler.micro_batch(0).step == 0 and len(first_pass) == 6


def test_micro_batches_are_numbered_from_the_start_of_each_pass() -> None:
    sampler = world_of(40, 2, 20, 4)[1]
    assert len(sampler) == 6
    first = next(iter(sampler))
    micro = sampler.micro_batch(0)
    assert (micro.step, micro.index, micro.count, micro.size) == (0, 0, 3, 4)
    assert [sampler.micro_batch(i).last for i in range(6)] == [False, False, True] * 2
    sampler.record_step()
    assert len(sampler) == 3
    second = next(iter(sampler))  # a new pass starts at the next global batch
    assert second != first and sampler.micro_batch(0).step == 1
    with pytest.raises(IndexError):
        sampler.micro_batch(3)
    sampler.record_step()
    assert len(sampler) == 0 and list(sampler) == [] and sampler.accumulation_steps == 0
    with pytest.raises(RuntimeError, match="past the last global batch"):
        sampler.record_step()


def test_a_loader_yields_the_planned_micro_batches() -> None:
    dataset = TensorDataset(torch.arange(30) + 1000)
    sampler = GlobalBatchSampler(dataset, 12, 4, rank_and_size=FixedRank(1, 3))
    loader = DataLoader(dataset, batch_sampler=sampler)
    expected = list(sampler)
    got = [(batch - 1000).tolist() for (batch,) in loader]
    assert got == expected
    assert [len(b) for b in got] == [4, 4, 2]  # 12, 12, then the last 6 samples over 3 ranks


def test_progress_round_trips_and_an_elastic_samplers_state_loads() -> None:
    sampler = world_of(96, 3, 20, 4)[0]
    train_steps([sampler, *world_of(96, 3, 20, 4)[1:]], 0)
    sampler.record_step()
    state = sampler.state_dict()
    assert state == {"epoch": 0, "processed_num": 20, "seed": 3, "shuffle": True}
    other = world_of(96, 2, 20, 4)[1]
    other.load_state_dict(state)
    assert other.processed_num == 20 and other.steps_left == 4
    elastic = ElasticSampler(range(96), seed=3, rank_and_size=FixedRank(0, 1))
    elastic.record_batch(0, 40)
    other.load_state_dict(elastic.state_dict())
    assert other.processed_num == 40 and other.steps_left == 3
    other.set_epoch(1)
    assert other.epoch == 1 and other.processed_num == 0 and other.steps_left == 5
    with pytest.raises(ValueError, match="processed_num"):
        other.load_state_dict({**state, "processed_num": 97})


@pytest.mark.parametrize(("global_batch", "micro"), [(0, 1), (1, 0)])
def test_a_non_positive_batch_is_refused(global_batch: int, micro: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        GlobalBatchSampler(range(4), global_batch, micro, rank_and_size=FixedRank(0, 1))


class Recorder:
    """Stands for a reducer: records what ``accumulate`` asked of it."""

    def __init__(self, kind: str) -> None:
        self.calls: list[Any] = []
        if kind == "optimizer":
            self.set_backward_passes_per_step = lambda n: self.calls.append(("passes", n))
        elif kind == "fsdp":
            self.set_requires_gradient_sync = lambda sync: self.calls.append(("sync", sync))
        elif kind == "ddp":
            self.no_sync = self._no_sync

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        self.calls.append("no_sync")
        yield


def test_accumulate_reduces_only_at_the_last_micro_batch() -> None:
    reducers = [Recorder(kind) for kind in ("optimizer", "fsdp", "ddp")]
    for index in range(3):
        with accumulate(MicroBatch(0, index, 3, 4, 1 / 3), *reducers):
            pass
    optimizer, fsdp, ddp = (r.calls for r in reducers)
    assert optimizer == [("passes", 3)]
    assert fsdp == [("sync", False), ("sync", False), ("sync", True)]
    assert ddp == ["no_sync", "no_sync"]
    with (
        pytest.raises(TypeError, match="DDP model, the FSDP2 module or the Distributed"),
        accumulate(MicroBatch(0, 0, 1, 1, 1.0), object()),
    ):
        pass
