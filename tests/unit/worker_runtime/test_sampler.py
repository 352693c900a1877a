"""Tests of the elastic sampler: exactly-once training across failures and resizes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler, batch_weight, plan_share
from elasticjob.worker_runtime.training import step_weight
from tests.support.fixed_rank import FixedRank


@pytest.fixture(autouse=True)
def no_weight_source_left() -> Iterator[None]:
    """A sampler given a batch size registers itself as the process's step-weight source."""
    yield
    step_weight.set_source(None)


def make_sampler(
    length: int,
    rank: int = 0,
    size: int = 1,
    *,
    shuffle: bool = True,
    seed: int = 0,
    batch_size: int | None = None,
) -> tuple[ElasticSampler, FixedRank]:
    runtime = FixedRank(rank, size)
    sampler = ElasticSampler(
        range(length), shuffle=shuffle, seed=seed, rank_and_size=runtime, batch_size=batch_size
    )
    return sampler, runtime


def values_dataset(length: int) -> TensorDataset:
    """Sample ``i`` holds the value ``1000 + i``, so a batch tells which indices it came from."""
    return TensorDataset(torch.arange(length) + 1000)


def loader_indices(loader: DataLoader[tuple[torch.Tensor, ...]]) -> list[list[int]]:
    return [[int(value) - 1000 for value in values] for (values,) in loader]


class Cluster(RuleBasedStateMachine):
    """A whole job in one process: one sampler per rank, a commit log and a failure model.

    The machine counts, independently of the sampler's own bookkeeping, how often each dataset
    index was trained at a non-padding position in the current (not rolled back) trajectory.
    With ``planned``, the samplers plan uneven last batches for the loader's batch size: no
    duplicates, and the weight of each batch is its share of real samples.
    """

    def __init__(self) -> None:
        super().__init__()
        self.length = 0
        self.batch_size = 1
        self.planned = False
        self.workers: list[tuple[ElasticSampler, FixedRank]] = []
        self.counts: list[int] = []
        self.steps = 0
        self.round_remaining: list[int] = []
        self.committed_state: dict[str, int | bool] = {}
        self.committed_counts: list[int] = []
        self.epochs_completed = 0

    @property
    def size(self) -> int:
        return len(self.workers)

    @initialize(
        length=st.integers(0, 30),
        batch_size=st.integers(1, 4),
        size=st.integers(1, 8),
        seed=st.integers(0, 2**16),
        shuffle=st.booleans(),
        planned=st.booleans(),
    )
    def start(
        self, length: int, batch_size: int, size: int, seed: int, shuffle: bool, planned: bool
    ) -> None:
        self.length = length
        self.batch_size = batch_size
        self.planned = planned
        self.workers = [self.make(rank, size, shuffle=shuffle, seed=seed) for rank in range(size)]
        self.counts = [0] * length
        self.new_round()
        self.commit()

    def make(
        self, rank: int, size: int, *, shuffle: bool, seed: int
    ) -> tuple[ElasticSampler, FixedRank]:
        batch_size = self.batch_size if self.planned else None
        return make_sampler(
            self.length, rank, size, shuffle=shuffle, seed=seed, batch_size=batch_size
        )

    def new_round(self) -> None:
        self.steps = 0
        self.round_remaining = self.workers[0][0].remaining_indices

    def train_step(self, use_indices: bool) -> None:
        n = len(self.round_remaining)
        for sampler, runtime in self.workers:
            batch = sampler.get_indices(self.steps, self.batch_size)
            real = 0
            for offset, index in enumerate(batch):
                position = runtime.rank + (self.steps * self.batch_size + offset) * self.size
                assert index == self.round_remaining[position % n]
                if position < n:
                    self.counts[index] += 1
                    real += 1
            if self.planned:
                # No duplicates: a batch is all real samples, or the single padding sample.
                assert real == len(batch) or (len(batch) == 1 and real == 0)
                weight = sampler.weight(step_weight.passes() + self.steps)
                assert weight == (real / self.batch_size if batch else 1.0)
            if use_indices:
                sampler.record_indices(batch)
            else:
                sampler.record_batch(self.steps, self.batch_size)
        self.steps += 1

    def reassign(self, new_size: int, order: list[int]) -> list[tuple[ElasticSampler, FixedRank]]:
        """Keeps some old workers in a new rank order, then tells every worker the new world."""
        survivors = [self.workers[i] for i in order[:new_size]]
        for rank, (_, runtime) in enumerate(survivors):
            runtime.rank = rank
            runtime.size = new_size
        return survivors

    def add_workers(self, new_size: int, state: dict[str, int | bool]) -> None:
        """Starts the workers that joined; they take the state the job broadcasts."""
        first = self.workers[0][0]
        for rank in range(len(self.workers), new_size):
            sampler, runtime = self.make(rank, new_size, shuffle=first.shuffle, seed=first.seed)
            sampler.load_state_dict(state)
            self.workers.append((sampler, runtime))

    @rule(steps=st.integers(1, 4), use_indices=st.booleans())
    def train(self, steps: int, use_indices: bool) -> None:
        for _ in range(steps):
            self.train_step(use_indices)

    @rule()
    def commit(self) -> None:
        self.committed_state = self.workers[0][0].state_dict()
        self.committed_counts = list(self.counts)

    @rule(new_size=st.integers(1, 8), data=st.data())
    def failure(self, new_size: int, data: st.DataObject) -> None:
        order = data.draw(st.permutations(range(self.size)))
        self.workers = self.reassign(new_size, order)
        for sampler, _ in self.workers:
            sampler.load_state_dict(self.committed_state)
        self.add_workers(new_size, self.committed_state)
        self.counts = list(self.committed_counts)
        self.new_round()

    @rule(new_size=st.integers(1, 8), data=st.data())
    def graceful_resize(self, new_size: int, data: st.DataObject) -> None:
        order = data.draw(st.permutations(range(self.size)))
        self.workers = self.reassign(new_size, order)
        for sampler, _ in self.workers:
            sampler.reset()
        self.add_workers(new_size, self.workers[0][0].state_dict())
        self.new_round()

    @rule(use_indices=st.booleans())
    def end_epoch(self, use_indices: bool) -> None:
        while any(len(sampler) for sampler, _ in self.workers):
            self.train_step(use_indices)
        assert self.counts == [1] * self.length
        for sampler, _ in self.workers:
            assert sampler.processed_num == self.length
            assert sampler.remaining_indices == []
        epoch = self.workers[0][0].epoch + 1
        for sampler, _ in self.workers:
            sampler.set_epoch(epoch)
        self.counts = [0] * self.length
        self.new_round()
        self.epochs_completed += 1

    @invariant()
    def ranks_agree_and_progress_is_exact(self) -> None:
        states = [sampler.state_dict() for sampler, _ in self.workers]
        assert all(state == states[0] for state in states)
        sampler = self.workers[0][0]
        assert max(self.counts, default=0) <= 1
        trained = {index for index, count in enumerate(self.counts) if count}
        assert len(trained) == sampler.processed_num
        assert trained == set(range(self.length)) - set(sampler.remaining_indices)
        recorded = min(self.steps * self.batch_size, sampler.num_samples)
        assert len(sampler) == sampler.num_samples - recorded


TestCluster = Cluster.TestCase
TestCluster.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)


def test_dataloader_with_workers_yields_the_rank_share() -> None:
    dataset = values_dataset(23)
    sampler, _ = make_sampler(23, rank=1, size=3, seed=7)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2)
    batches = loader_indices(loader)
    assert [index for batch in batches for index in batch] == list(sampler)
    assert [len(batch) for batch in batches] == [4, 4]
    assert sampler.num_samples == 8
    assert sampler.total_size == 24
    for batch_idx, batch in enumerate(batches):
        assert batch == sampler.get_indices(batch_idx, 4)
        sampler.record_batch(batch_idx, 4)
    assert sampler.processed_num == 23
    assert len(sampler) == 0


def test_dataloader_cluster_survives_a_resize_exactly_once() -> None:
    length, batch_size = 37, 3
    dataset = values_dataset(length)
    seen: list[int] = []
    workers = [make_sampler(length, rank, 4, seed=3) for rank in range(4)]
    loaders = [
        DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2)
        for sampler, _ in workers
    ]
    round_remaining = workers[0][0].remaining_indices
    # Two steps with four ranks: every rank's first six samples are real, none is padding.
    for loader, (sampler, _) in zip(loaders, workers, strict=True):
        for batch_idx, batch in enumerate(loader_indices(loader)[:2]):
            seen.extend(batch)
            sampler.record_batch(batch_idx, batch_size)
    assert sorted(seen) == sorted(round_remaining[:24])
    # Rank 3 leaves gracefully; the others renumber and split the rest.
    survivors = [workers[2], workers[0], workers[1]]
    for rank, (sampler, runtime) in enumerate(survivors):
        runtime.rank, runtime.size = rank, 3
        sampler.reset()
        assert sampler.processed_num == 24
    n = length - 24
    for sampler, runtime in survivors:
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=0)
        for batch_idx, batch in enumerate(loader_indices(loader)):
            for offset, index in enumerate(batch):
                if runtime.rank + (batch_idx * batch_size + offset) * 3 < n:
                    seen.append(index)
            sampler.record_batch(batch_idx, batch_size)
        assert sampler.processed_num == length
    assert sorted(seen) == list(range(length))


def test_set_epoch_changes_the_order_when_shuffled() -> None:
    sampler, _ = make_sampler(50, seed=11)
    twin, _ = make_sampler(50, seed=11)
    first = list(sampler)
    assert first == list(twin)
    assert sorted(first) == list(range(50))
    sampler.set_epoch(1)
    second = list(sampler)
    assert sampler.epoch == 1
    assert second != first
    assert sorted(second) == list(range(50))
    other_seed, _ = make_sampler(50, seed=12)
    assert list(other_seed) != first


def test_without_shuffle_the_order_is_the_dataset_order() -> None:
    sampler, runtime = make_sampler(10, shuffle=False)
    assert list(sampler) == list(range(10))
    sampler.set_epoch(5)
    assert list(sampler) == list(range(10))
    runtime.rank, runtime.size = 1, 3
    sampler.reset()
    assert list(sampler) == [1, 4, 7, 0]
    assert sampler.remaining_indices == list(range(10))


def test_state_dict_round_trips_through_json() -> None:
    sampler, _ = make_sampler(20, rank=0, size=2, seed=5)
    sampler.set_epoch(3)
    sampler.record_batch(1, 3)
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state == {"epoch": 3, "processed_num": 12, "seed": 5, "shuffle": True}
    restored, _ = make_sampler(20, rank=1, size=4, seed=5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.remaining_indices == sampler.remaining_indices
    assert restored.num_samples == 2
    assert len(restored.remaining_indices) == 8


def test_load_state_dict_follows_the_saved_seed_and_shuffle() -> None:
    saved, _ = make_sampler(15, shuffle=False, seed=1)
    saved.record_batch(0, 4)
    sampler, _ = make_sampler(15, shuffle=True, seed=9)
    sampler.load_state_dict(saved.state_dict())
    assert sampler.state_dict() == saved.state_dict()
    assert list(sampler) == list(range(4, 15))


@pytest.mark.parametrize(
    "state",
    [
        {"epoch": 0, "processed_num": 0, "seed": 0},
        {"epoch": 0, "processed_num": 11, "seed": 0, "shuffle": True},
        {"epoch": 0, "processed_num": -1, "seed": 0, "shuffle": True},
        {"epoch": "0", "processed_num": 0, "seed": 0, "shuffle": True},
        {"epoch": 0, "processed_num": True, "seed": 0, "shuffle": True},
        {"epoch": 0, "processed_num": 0, "seed": 0, "shuffle": 1},
    ],
)
def test_load_state_dict_rejects_bad_state(state: dict[str, Any]) -> None:
    sampler, _ = make_sampler(10)
    with pytest.raises(ValueError, match="sampler state"):
        sampler.load_state_dict(state)


def test_record_indices_must_follow_the_share_in_order() -> None:
    sampler, _ = make_sampler(12, rank=1, size=2, shuffle=False)
    share = list(sampler)
    assert share == [1, 3, 5, 7, 9, 11]
    with pytest.raises(ValueError, match="next unrecorded"):
        sampler.record_indices([3, 1])
    with pytest.raises(ValueError, match="next unrecorded"):
        sampler.record_indices([3])
    sampler.record_indices(torch.tensor([1, 3]).tolist())
    assert sampler.processed_num == 4
    with pytest.raises(ValueError, match="next unrecorded"):
        sampler.record_indices([5, 7, 9, 11, 1])
    sampler.record_indices([5, 7, 9, 11])
    assert sampler.processed_num == 12
    sampler.record_indices([])
    assert sampler.processed_num == 12


def test_record_batch_clamps_and_never_moves_backwards() -> None:
    sampler, _ = make_sampler(10, rank=0, size=2)
    sampler.record_batch(1, 2)
    assert sampler.processed_num == 8
    sampler.record_batch(0, 2)
    assert sampler.processed_num == 8
    sampler.record_batch(9, 2)
    assert sampler.processed_num == 10
    with pytest.raises(ValueError, match="batch_size"):
        sampler.record_batch(0, 0)
    with pytest.raises(ValueError, match="batch_idx"):
        sampler.get_indices(-1, 2)


def test_padding_is_never_counted() -> None:
    sampler, _ = make_sampler(5, rank=3, size=4, shuffle=False)
    assert list(sampler) == [3, 2]
    assert sampler.total_size == 8
    sampler.record_batch(0, 1)
    assert sampler.processed_num == 4
    sampler.record_batch(1, 1)
    assert sampler.processed_num == 5
    assert sampler.remaining_indices == []


def test_reiterating_a_partial_round_does_not_repeat() -> None:
    sampler, _ = make_sampler(10, rank=0, size=2, seed=2)
    share = list(sampler)
    sampler.record_batch(0, 2)
    assert len(sampler) == 3
    assert list(sampler) == share[2:]
    loader = DataLoader(values_dataset(10), batch_size=2, sampler=sampler)
    assert loader_indices(loader) == [share[2:4], share[4:]]


def test_empty_dataset() -> None:
    sampler, runtime = make_sampler(0, rank=2, size=3)
    assert len(sampler) == 0
    assert list(sampler) == []
    assert sampler.num_samples == 0
    assert sampler.total_size == 0
    assert sampler.get_indices(0, 4) == []
    sampler.record_batch(0, 4)
    sampler.record_indices([])
    assert sampler.state_dict()["processed_num"] == 0
    assert loader_indices(DataLoader(values_dataset(0), batch_size=2, sampler=sampler)) == []
    runtime.rank, runtime.size = 0, 1
    sampler.set_epoch(1)
    assert list(sampler) == []


def test_dataset_smaller_than_the_world() -> None:
    length, size = 3, 8
    workers = [make_sampler(length, rank, size, seed=4) for rank in range(size)]
    remaining = workers[0][0].remaining_indices
    shares = [list(sampler) for sampler, _ in workers]
    assert shares == [[remaining[rank % length]] for rank in range(size)]
    for sampler, _ in workers:
        sampler.record_batch(0, 2)
        assert sampler.processed_num == length
        assert len(sampler) == 0


def test_n_below_size_after_partial_progress() -> None:
    length = 10
    workers = [make_sampler(length, rank, 2, shuffle=False) for rank in range(2)]
    for sampler, _ in workers:
        sampler.record_batch(1, 2)
    for rank, (sampler, runtime) in enumerate(workers):
        runtime.rank, runtime.size = rank, 2
        sampler.reset()
        assert sampler.remaining_indices == [8, 9]
    assert [list(sampler) for sampler, _ in workers] == [[8], [9]]
    grown = [make_sampler(length, rank, 5, shuffle=False) for rank in range(5)]
    for sampler, _ in grown:
        sampler.load_state_dict(workers[0][0].state_dict())
    assert [list(sampler) for sampler, _ in grown] == [[8], [9], [8], [9], [8]]
    for sampler, _ in grown:
        sampler.record_indices(list(sampler))
        assert sampler.processed_num == length


def test_invalid_rank_or_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid rank"):
        make_sampler(4, rank=2, size=2)
    sampler, runtime = make_sampler(4)
    runtime.size = 0
    with pytest.raises(ValueError, match="invalid rank"):
        sampler.reset()


def test_rank_and_size_default_to_the_worker_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elasticjob.worker_runtime, "rank", lambda: 1, raising=False)
    monkeypatch.setattr(elasticjob.worker_runtime, "size", lambda: 2, raising=False)
    sampler = ElasticSampler(range(6), shuffle=False)
    assert (sampler.rank, sampler.num_replicas) == (1, 2)
    assert list(sampler) == [1, 3, 5]


# ---- uneven last batches (batch_size given) --------------------------------------------------


@pytest.mark.parametrize(
    ("remaining", "rank", "size", "batch_size", "expected"),
    [
        # Without a batch size, shares are padded to the longest with wrapped-around samples.
        (10, 0, 3, None, (4, 0)),
        (10, 2, 3, None, (3, 1)),
        (3, 5, 8, None, (0, 1)),
        # 97 samples, 3 ranks, batches of 4: 33/32/32 samples, 9 steps each; the two short
        # shares end after 8 full batches and get one padding sample for the ninth step.
        (97, 0, 3, 4, (33, 0)),
        (97, 1, 3, 4, (32, 1)),
        (97, 2, 3, 4, (32, 1)),
        # 10 samples, 3 ranks, batches of 2: 4/3/3 samples, 2 steps; short last batches only.
        (10, 1, 3, 2, (3, 0)),
        # Fewer samples than ranks: a rank with nothing gets one padding sample.
        (3, 5, 8, 4, (0, 1)),
        (3, 2, 8, 4, (1, 0)),
        (0, 0, 2, 4, (0, 0)),
        (12, 1, 3, 4, (4, 0)),
    ],
)
def test_plan_share(
    remaining: int, rank: int, size: int, batch_size: int | None, expected: tuple[int, int]
) -> None:
    assert plan_share(remaining, rank, size, batch_size) == expected


@pytest.mark.parametrize(
    ("real", "padding", "batch", "expected"),
    [
        (33, 0, 0, 1.0),
        (33, 0, 8, 0.25),  # the last batch holds 1 of 4 samples
        (32, 1, 7, 1.0),
        (32, 1, 8, 0.0),  # the padding sample
        (3, 0, 0, 0.75),
        (33, 0, 9, 1.0),  # past the plan: not a batch of this sampler
        (0, 1, 0, 0.0),
    ],
)
def test_batch_weight(real: int, padding: int, batch: int, expected: float) -> None:
    assert batch_weight(real, padding, 4, batch) == expected


def test_planned_loader_batches_train_every_sample_once_with_weights() -> None:
    """97 samples, 3 ranks, a plain DataLoader with batch_size=4: every rank runs 9 steps,
    no sample twice, and the weights say how much of a full batch each step trained."""
    length, size, batch_size = 97, 3, 4
    workers = [
        make_sampler(length, rank, size, seed=3, batch_size=batch_size) for rank in range(size)
    ]
    batches = [
        loader_indices(DataLoader(values_dataset(length), batch_size=batch_size, sampler=s))
        for s, _ in workers
    ]
    assert [len(b) for b in batches] == [9, 9, 9]
    assert [len(b[-1]) for b in batches] == [1, 1, 1]
    weights = [[s.weight(step_weight.passes() + k) for k in range(9)] for s, _ in workers]
    assert [w[-1] for w in weights] == [0.25, 0.0, 0.0]
    trained = [
        index
        for rank_batches, rank_weights in zip(batches, weights, strict=True)
        for batch, weight in zip(rank_batches, rank_weights, strict=True)
        if weight > 0
        for index in batch
    ]
    assert sorted(trained) == list(range(length))
    for step in range(9):
        real = sum(len(b[step]) for b, w in zip(batches, weights, strict=True) if w[step] > 0)
        assert sum(w[step] for w in weights) * batch_size == real
    for step, _ in enumerate(batches[0]):
        for sampler, _ in workers:
            sampler.record_batch(step, batch_size)
        assert len({sampler.processed_num for sampler, _ in workers}) == 1
    assert workers[1][0].processed_num == length


def test_planned_sampler_is_the_step_weight_source_from_its_last_reset() -> None:
    sampler, runtime = make_sampler(10, rank=1, size=3, shuffle=False, batch_size=2)
    assert list(sampler) == [1, 4, 7]
    assert sampler.num_real_samples == 3 and sampler.total_size == 10
    assert step_weight.pass_weight() == 1.0
    step_weight.pass_done()
    assert step_weight.pass_weight() == 0.5  # batch 1 holds [7] only
    step_weight.pass_done()
    assert step_weight.pass_weight() == 1.0  # past the plan
    runtime.rank, runtime.size = 0, 1
    sampler.reset()  # a new round: pass 0 of it is batch 0 again
    assert step_weight.pass_weight() == 1.0
    assert list(sampler) == list(range(10))


def test_without_batch_size_there_is_no_weight_source() -> None:
    step_weight.set_source(None)
    make_sampler(10, rank=1, size=3)
    assert step_weight.pass_weight() == 1.0
    with pytest.raises(ValueError, match="batch_size"):
        make_sampler(10, batch_size=0)
