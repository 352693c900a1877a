"""Durable checkpoints of a ``TorchState`` in this process (the standalone runtime, real
files): written by policy off the training thread and reported, loaded by a fresh state in
``elastic.run`` (weights, optimizer, sampler position, attributes and the step), and a
checkpoint of another model is refused with a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

import elasticjob.worker_runtime as hvd
from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_KEEP,
)
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.elastic import CheckpointError, ElasticSampler, TorchState
from tests.support.worker_env import standalone_env

SAMPLES = 40
FEATURES = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(5))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A standalone runtime whose job checkpoints into the returned folder every 3 commits."""
    standalone_env(monkeypatch)
    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(tmp_path / "ckpt"))
    monkeypatch.setenv(ENV_CHECKPOINT_EVERY_COMMITS, "3")
    monkeypatch.setenv(ENV_CHECKPOINT_KEEP, "2")
    hvd.init()
    yield tmp_path / "ckpt"
    hvd.shutdown()


def reports(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    """What the runtime is asked to report: checkpoints written, checkpoints resumed from."""
    written: list[Any] = []
    resumed: list[Any] = []
    runtime_reports = basics.current().reports
    monkeypatch.setattr(runtime_reports, "checkpoint", written.append)
    monkeypatch.setattr(
        runtime_reports, "resumed", lambda restored_from=None: resumed.append(restored_from)
    )
    return written, resumed


def make_state(seed: int, hidden: int = 16) -> TorchState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)
    )
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    dataset = TensorDataset(FEATURES, torch.arange(SAMPLES))
    sampler = ElasticSampler(dataset, shuffle=True, seed=3)
    return TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)


def train(state: TorchState, batches: int) -> None:
    """``batches`` steps of 4 samples, each committed."""
    for _ in range(batches):
        indices = list(state.sampler)[:4]
        x = FEATURES[indices]
        state.optimizer.zero_grad()
        state.model(x).square().mean().backward()
        state.optimizer.step()
        state.sampler.record_batch(0, 4)
        state.batch += 1
        state.commit()


def snapshot(state: TorchState) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in state.model.state_dict().items()},
        "adam": [t.clone() for s in state.optimizer.state.values() for t in s.values()],
        "sampler": state.sampler.state_dict(),
        "batch": state.batch,
        "epoch": state.epoch,
        "step": basics.current().step,
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert all(torch.equal(x, y) for x, y in zip(a["adam"], b["adam"], strict=True))
    assert {k: a[k] for k in ("sampler", "batch", "epoch", "step")} == {
        k: b[k] for k in ("sampler", "batch", "epoch", "step")
    }


def test_policy_writes_off_thread_keeps_k_and_reports(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, _ = reports(monkeypatch)
    state = make_state(0)
    train(state, 3)  # the 3rd commit is due
    state.checkpointing.wait()
    assert [r.step for r in written] == [3]
    train(state, 7)  # commits 6 and 9 are due (the writer is done by then or skips)
    state.checkpointing.wait()
    steps = [r.step for r in written]
    assert steps[0] == 3 and len(steps) >= 2 and steps == sorted(steps)
    on_disk = sorted(p.name for p in folder.iterdir())
    assert len(on_disk) == 2  # keep 2
    assert on_disk[-1] == written[-1].name
    assert all(r.size_bytes > 0 and r.seconds >= 0 for r in written)


def test_a_fresh_state_resumes_from_the_newest_checkpoint_in_elastic_run(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, resumed = reports(monkeypatch)
    old = make_state(0)
    train(old, 5)
    old.checkpoint()
    old.checkpointing.wait()
    expected = snapshot(old)
    train(old, 2)  # lost with the process: trained again after the resume
    basics.current().step = 0  # a fresh process

    fresh = make_state(1)  # other initial weights
    seen: list[dict[str, Any]] = []

    @hvd.elastic.run
    def training(state: TorchState) -> None:
        seen.append(snapshot(state))

    training(fresh)
    assert_same(seen[0], expected)
    assert len(resumed) == 1 and resumed[0] is not None
    assert resumed[0].name == written[-1].name and resumed[0].step == 5
    # A state that holds the job's state never reloads (a second elastic.run).
    train(fresh, 1)
    training(fresh)
    assert resumed[-1] is None and seen[-1]["batch"] == 6


def test_a_checkpoint_of_another_model_is_refused(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports(monkeypatch)
    old = make_state(0, hidden=16)
    train(old, 3)
    old.checkpointing.wait()
    other = make_state(1, hidden=8)
    before = snapshot(other)
    with pytest.raises(CheckpointError, match=r"model\.0\.weight is \(16, 4\).*\(8, 4\)"):
        other.sync()  # a fresh state's sync loads the newest checkpoint
    assert_same(snapshot(other), before)  # untouched


def test_checkpoint_without_a_folder_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    standalone_env(monkeypatch)
    hvd.init()
    try:
        with pytest.raises(RuntimeError, match="ELASTICJOB_CHECKPOINT_DIR"):
            make_state(0).checkpoint()
    finally:
        hvd.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("background", [False, True])
def test_a_cuda_state_commits_restores_and_resumes(
    folder: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    """Snapshot buffers on the device; the writer copies them to the host; a fresh state
    loads the host tensors into its device tensors."""
    reports(monkeypatch)

    def cuda_state(seed: int) -> TorchState:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 2)
        ).cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        return TorchState(model, optimizer, background_commit=background, epoch=0)

    def cuda_step(state: TorchState, seed: int) -> None:
        torch.manual_seed(seed)
        state.optimizer.zero_grad()
        state.model(torch.randn(16, 64, device="cuda")).square().mean().backward()
        state.optimizer.step()

    def weights(state: TorchState) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in state.model.state_dict().items()}

    old = cuda_state(0)
    for seed in range(3):
        cuda_step(old, seed)
        old.commit()
    committed = weights(old)
    old.checkpoint()
    cuda_step(old, 9)
    cuda_step(old, 10)
    old.restore()
    assert all(torch.equal(v, committed[k]) for k, v in weights(old).items())
    old.checkpointing.wait()

    fresh = cuda_state(1)
    fresh.sync()  # a fresh state's sync loads the newest checkpoint
    assert fresh.checkpointing.take_loaded() is not None
    assert all(torch.equal(v, committed[k]) for k, v in weights(fresh).items())
    assert all(t.is_cuda for s in fresh.optimizer.state.values() for t in s.values() if t.dim() > 0)
    cuda_step(fresh, 11)  # trains on from the loaded state
