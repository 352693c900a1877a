"""Snapshots of committed state: the contents come back exactly, buffers are reused, a
pinned snapshot never changes, and a background commit is complete before the next
optimizer step and before any restore."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator

import pytest
import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.elastic import TorchState
from elasticjob.worker_runtime.elastic import snapshot as snapshot_module
from elasticjob.worker_runtime.elastic.snapshot import (
    Snapshot,
    SnapshotKeeper,
    TensorRef,
    find_tensors,
    plan_slots,
    rebuild,
)
from tests.support.worker_env import standalone_env


@pytest.fixture(autouse=True)
def standalone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    standalone_env(monkeypatch)
    hvd.init()
    yield
    hvd.shutdown()


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(8, 6)).square().mean().backward()
    optimizer.step()


def weights(state: TorchState) -> dict[str, torch.Tensor]:
    model: torch.nn.Module = state.model
    return {k: v.clone() for k, v in model.state_dict().items()}


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t.clone() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def test_plan_slots_aligns_every_tensor_and_packs_per_device() -> None:
    slots, devices, sizes = plan_slots(
        (
            (torch.uint8, (3,), torch.device("cpu")),
            (torch.float64, (2, 2), torch.device("cpu")),
            (torch.bool, (), torch.device("cpu")),
        )
    )
    assert devices == (torch.device("cpu"),)
    assert [s.offset for s in slots] == [0, 64, 128]
    assert [s.nbytes for s in slots] == [3, 32, 1]
    assert sizes == (192,)


def test_skeleton_keeps_structure_and_non_tensor_values() -> None:
    ordered = collections.OrderedDict(a=torch.ones(2))
    ordered._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    value = {"m": ordered, "lr": [0.1, (torch.zeros(1), "x")], "n": 3}
    tensors = find_tensors(value)
    assert len(tensors) == 2
    copies = [torch.full_like(t, 7) for t in tensors]
    back = rebuild({"m": ordered, "lr": [0.1, (TensorRef(1), "x")], "n": 3}, copies)
    assert back["lr"][1][0] is copies[1] and back["n"] == 3
    assert back["m"]._metadata == {"": {"version": 2}}


@pytest.mark.parametrize("background", [False, True])
def test_restore_returns_the_committed_state(background: bool) -> None:
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = TorchState(model, optimizer, background_commit=background, epoch=0, seen=[1, 2])
    train_step(model, optimizer, 1)
    state.epoch, state.seen = 1, [3]
    state.commit()
    committed, committed_opt = weights(state), optimizer_state(optimizer)
    for seed in (2, 3):
        train_step(model, optimizer, seed)  # changes weights, BN buffers and Adam's state
    state.epoch = 5
    state.seen.append(4)
    state.restore()
    assert_same(weights(state), committed)
    now = optimizer_state(optimizer)
    assert all(torch.equal(a, b) for a, b in zip(now, committed_opt, strict=True))
    assert (state.epoch, state.seen) == (1, [3])
    # The optimizer does not share tensors with the snapshot: stepping on changes nothing.
    train_step(model, optimizer, 4)
    state.restore()
    assert_same(weights(state), committed)


def test_commits_reuse_their_buffers() -> None:
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer)
    train_step(model, optimizer, 1)  # creates momentum buffers: a new layout
    state.commit()
    state.commit()
    pointers = set()
    for _ in range(4):
        train_step(model, optimizer, 2)
        state.commit()
        committed = state._keeper.committed()
        assert committed is not None
        pointers.add(committed.buffers[0].data_ptr())
    assert len(pointers) == 2  # two buffers take turns: the committed one and the next


def test_a_pinned_snapshot_never_changes_and_is_reused_once_released() -> None:
    keeper = SnapshotKeeper()
    live = {"w": torch.zeros(1000)}
    keeper.capture(live, {"step": 1}, lambda _t: False)
    pinned = keeper.pin()
    assert pinned is not None
    for value in (1.0, 2.0, 3.0):
        live["w"].fill_(value)
        keeper.capture(live, {"step": int(value) + 1}, lambda _t: False)
    assert torch.equal(pinned.value()["w"], torch.zeros(1000))
    assert pinned.meta == {"step": 1}
    keeper.unpin(pinned)
    live["w"].fill_(4.0)
    keeper.capture(live, {}, lambda _t: False)
    assert keeper.committed() is pinned  # its buffers were free again
    assert torch.equal(pinned.value()["w"], torch.full((1000,), 4.0))


@pytest.mark.parametrize("distributed", [False, True])
def test_background_copy_completes_before_the_next_optimizer_step(
    distributed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(200, 200)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer)
    step_started, step_done = threading.Event(), threading.Event()
    optimizer.register_step_pre_hook(lambda *_: step_started.set())  # runs before the state's
    state = TorchState(model, optimizer, background_commit=True)
    optimizer.register_step_post_hook(lambda *_: step_done.set())
    _big_step(model, optimizer, 1)
    real_copy = snapshot_module._copy

    def late_copy(pairs: list[tuple[torch.Tensor, torch.Tensor]], snapshot: Snapshot) -> None:
        # A copy still running when the next step starts: it goes on once that step is done,
        # or after 0.5 s if the step waits for it.
        if step_started.wait(5.0):
            step_done.wait(0.5)
        real_copy(pairs, snapshot)

    monkeypatch.setattr(snapshot_module, "_copy", late_copy)
    step_started.clear()
    step_done.clear()
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    _big_step(model, optimizer, 2)  # its step waits for the copy
    assert step_done.is_set()
    state.restore()
    assert_same({k: v.clone() for k, v in model.state_dict().items()}, committed)


def _big_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(4, 200)).square().mean().backward()
    optimizer.step()


def test_a_failed_background_copy_keeps_the_previous_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper = SnapshotKeeper(background=True)
    keeper.capture({"w": torch.zeros(10)}, {"step": 1}, lambda _t: True)
    first = keeper.committed()

    def failing_copy(_pairs: object, snapshot: Snapshot) -> None:
        snapshot.filled(OSError("no memory"))

    monkeypatch.setattr(snapshot_module, "_copy", failing_copy)
    keeper.capture({"w": torch.ones(10)}, {"step": 2}, lambda _t: True)
    with pytest.raises(RuntimeError, match="background copy of a commit failed"):
        keeper.wait()
    assert keeper.committed() is first
    assert first is not None and torch.equal(first.value()["w"], torch.zeros(10))


def test_snapshot_value_views_its_own_buffers() -> None:
    snapshot = Snapshot(((torch.float32, (2, 3), torch.device("cpu")),))
    snapshot.skeleton = {"t": TensorRef(0)}
    snapshot.tensors[0].fill_(2.5)
    assert snapshot.value()["t"].data_ptr() == snapshot.buffers[0].data_ptr()
    assert snapshot.nbytes == 64


def test_checkpoints_in_the_steady_state_allocate_no_new_buffers() -> None:
    keeper = SnapshotKeeper()
    live = {"w": torch.zeros(1000)}
    snapshots: dict[int, Snapshot] = {}  # by id, kept alive: an id is never reused
    for _ in range(6):  # a checkpoint pins the committed snapshot, two commits, released
        keeper.capture(live, {}, lambda _t: False)
        pinned = keeper.pin()
        assert pinned is not None
        for _ in range(2):
            keeper.capture(live, {}, lambda _t: False)
            committed = keeper.committed()
            assert committed is not None
            snapshots[id(committed)] = committed
        keeper.unpin(pinned)
    assert len(snapshots) <= 3
