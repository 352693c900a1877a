"""The elastic ``DistributedDataParallel`` in this process (the standalone runtime, real Gloo
groups): the weighted average and the pass count of its comm hook, a fresh DDP on each round's
group, and a backward pass blocked on a silent peer that raises as soon as the round is
aborted (what the driver's failure notice does) instead of at the collective timeout, and the
host-update vote riding the last bucket."""

from __future__ import annotations

import gc
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics, step_weight
from elasticjob.worker_runtime.process_group import RoundGroup

ABORT_AFTER_S = 0.5
RAISED_WITHIN_S = 5.0
"""A backward pass on an aborted group must raise this soon (the group's timeout is 40 s)."""


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundGroup]:
    """The standalone runtime's round group (a world of one until a test re-forms it)."""
    for name in [n for n in os.environ if n.startswith("ELASTICJOB_")]:
        monkeypatch.delenv(name)
    hvd.init()
    yield basics.current().group
    step_weight.set_source(None)
    hvd.shutdown()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def backward(model: Callable[[torch.Tensor], torch.Tensor], batch: int = 4) -> None:
    torch.manual_seed(1)
    model(torch.randn(batch, 3)).square().mean().backward()


class Weights:
    """A step-weight source with fixed weights per pass."""

    def __init__(self, *weights: float) -> None:
        self.start = step_weight.passes()
        self.weights = weights

    def weight(self, passes: int) -> float:
        return self.weights[passes - self.start]


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
    notice = threading.Timer(ABORT_AFTER_S, group.abort, ["a member of round 1 failed"])
    notice.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="HorovodInternalError: a member of round 1 failed"):
        backward(model)
    waited = time.monotonic() - started
    notice.join()
    assert ABORT_AFTER_S <= waited < ABORT_AFTER_S + RAISED_WITHIN_S
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
