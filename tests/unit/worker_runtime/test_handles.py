"""Async handles in a standalone world of one (a real Gloo group in this process): results
come back through ``synchronize``; a handle whose round broke, or was replaced by a newer
round, raises ``HorovodInternalError`` at once instead of waiting; ``poll`` never blocks."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("ELASTICJOB_")]:
        monkeypatch.delenv(name)
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


def test_adasum_and_process_subsets_are_refused_by_name(world_of_one: None) -> None:
    with pytest.raises(NotImplementedError, match=r"op=hvd\.Average"):
        hvd.grouped_allreduce([torch.ones(1)], op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="global_process_set"):
        hvd.ProcessSet([0, 1])
    with pytest.raises(NotImplementedError, match="global_process_set"):
        hvd.barrier(process_set="ranks 0 and 1")  # type: ignore[arg-type]
