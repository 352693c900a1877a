"""The elastic ``DistributedDataParallel`` in this process (the standalone runtime, real Gloo
groups): the weighted average and the pass count of its comm hook, a fresh DDP on each round's
group, and a backward pass blocked on a silent peer that raises as soon as the round is
aborted (what the driver's failure notice does) instead of at the collective timeout, and the
host-update vote riding the last bucket."""

from __future__ import annotations

import gc
import subprocess
import time
import weakref

import pytest
import torch
import torch.distributed as dist

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.training import step_weight
from tests.support.gradient_reduction import (
    RAISED_WITHIN_S,
    Weights,
    backward,
    mlp,
    raises_when_aborted,
)


@pytest.fixture
def group(runtime_group: RoundGroup) -> RoundGroup:
    """The standalone runtime's round group."""
    return runtime_group


def test_one_pass_per_backward_and_weights_scale_nothing_in_a_world_of_one(
    group: RoundGroup,
) -> None:
    reference = mlp()
    backward(reference)
    model = hvd.elastic.DistributedDataParallel(mlp(), bucket_cap_mb=0.0001)
    step_weight.set_source(Weights(0.25, 0.0))
    before = step_weight.passes()
    backward(model)
    assert step_weight.passes() == before + 1, "one pass per backward, whatever the buckets"
    for got, want in zip(model.module.parameters(), reference.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad)  # 0.25 * g / 0.25
    model.module.zero_grad()
    backward(model)  # weight 0 everywhere: nothing trained
    assert all(p.grad is not None and not p.grad.any() for p in model.module.parameters())
    assert step_weight.passes() == before + 2


def test_a_new_round_gets_a_new_ddp_and_the_old_one_is_let_go(group: RoundGroup) -> None:
    model = hvd.elastic.DistributedDataParallel(mlp())
    first = model.wrapped
    assert model.wrapped is first, "kept within a round"
    assert first.process_group is dist.distributed_c10d._get_default_group()
    backward(model)
    gone = weakref.ref(first)
    del first
    basics.current().reset()  # the next round (standalone: a new world of one)
    gc.collect()
    assert gone() is None, "the old round's DDP outlived its group"
    assert model.process_group is dist.distributed_c10d._get_default_group()
    backward(model)


def test_a_backward_blocked_on_a_silent_peer_raises_when_the_round_is_aborted(
    group: RoundGroup, silent_peer: subprocess.Popen[str]
) -> None:
    model = hvd.elastic.DistributedDataParallel(mlp())
    failed = "HorovodInternalError: a member of round 1 failed"
    raises_when_aborted(group, lambda: backward(model), RuntimeError, failed)
    assert group.errored() is not None

    # The next round forms at once: the DDP of the broken one holds nothing that waits.
    started = time.monotonic()
    basics.current().reset()
    assert time.monotonic() - started < RAISED_WITHIN_S
    backward(model)


def test_the_host_update_vote_rides_the_last_bucket(group: RoundGroup) -> None:
    """After a DDP step the host-update check needs no collective of its own: it still
    answers once the group is broken, which a collective would not."""
    model = hvd.elastic.DistributedDataParallel(mlp(), bucket_cap_mb=0.0001)
    backward(model)
    group.abort("broken after the step (test)")
    basics.current().check_host_updates()  # settled by the hook: no collective
    with pytest.raises(hvd.HorovodInternalError, match="broken after the step"):
        basics.current().check_host_updates()  # nothing settled any more: a collective
