"""DistributedOptimizer's hook-driven reducer in this process (the standalone runtime, real
Gloo groups): step weights over one and several passes, the host-update vote riding the
first exact bucket, and a backward blocked on a silent peer that raises as soon as the round
is aborted (what the driver's failure notice does) instead of at the collective timeout."""

from __future__ import annotations

import copy
import subprocess

import pytest
import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.training import step_weight
from elasticjob.worker_runtime.training.gradient_reducer import Reduction, result_scale
from tests.support.gradient_reduction import Weights, backward, mlp, raises_when_aborted


@pytest.fixture
def group(runtime_group: RoundGroup) -> RoundGroup:
    """The standalone runtime's round group."""
    return runtime_group


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


AVG, SUM = hvd.ReduceOp.AVERAGE, hvd.ReduceOp.SUM


@pytest.mark.parametrize(
    ("reduction", "size", "weight", "passes", "expected"),
    [
        pytest.param(Reduction(AVG, None), 4, 4.0, 4.0, 0.25, id="weights 1: plain mean"),
        pytest.param(Reduction(AVG, None), 4, 12.0, 12.0, 0.25, id="3 passes: sum over mean"),
        pytest.param(Reduction(AVG, None), 2, 1.5, 2.0, 2 / 3, id="uneven: per weight"),
        pytest.param(Reduction(AVG, None, 4.0), 4, 4.0, 4.0, 1.0, id="predivide undone"),
        pytest.param(Reduction(AVG, None), 3, 0.0, 3.0, 0.0, id="padding only: zero"),
        pytest.param(Reduction(SUM, None), 4, 0.0, 0.0, 1.0, id="sum: as reduced"),
    ],
)
def test_result_scale(
    reduction: Reduction, size: int, weight: float, passes: float, expected: float
) -> None:
    assert result_scale(reduction, size, weight, passes) == pytest.approx(expected)


def test_weights_of_one_pass_cancel_in_a_world_of_one(group: RoundGroup) -> None:
    reference = mlp()
    backward(reference)
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0)
    step_weight.set_source(Weights(0.25, 0.0))
    before = step_weight.passes()
    backward(model)
    assert step_weight.passes() == before + 1, "one pass per backward, whatever the buckets"
    for got, want in zip(grads(model), grads(reference), strict=True):
        torch.testing.assert_close(got, want)  # 0.25 * g / 0.25
    opt.step()
    opt.zero_grad()
    backward(model)  # weight 0 everywhere: nothing trained
    assert all(not g.any() for g in grads(model))


def test_weights_of_accumulated_passes(group: RoundGroup) -> None:
    """Two passes of weights 1 and 0.5: ``w * g`` per pass, summed, over the mean weight per
    pass (with weights 1 that is Horovod's plain sum of the passes)."""
    first, second = mlp(), mlp()
    backward(first, seed=1)
    backward(second, seed=2)
    model = mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2
    )
    step_weight.set_source(Weights(1.0, 0.5))
    backward(model, seed=1)
    backward(model, seed=2)
    expected = [(a + 0.5 * b) / 0.75 for a, b in zip(grads(first), grads(second), strict=True)]
    for got, want in zip(grads(model), expected, strict=True):
        torch.testing.assert_close(got, want)
    opt.step()


def test_the_host_update_vote_rides_the_first_exact_bucket(group: RoundGroup) -> None:
    """After a step the host-update check needs no collective of its own: it still answers
    once the group is broken, which a collective would not."""
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0)
    backward(model)
    opt.step()
    group.abort("broken after the step (test)")
    basics.current().check_host_updates()  # settled by the reduction: no collective
    with pytest.raises(hvd.HorovodInternalError, match="broken after the step"):
        basics.current().check_host_updates()  # nothing settled any more: a collective


def test_no_vote_rides_compressed_buckets(group: RoundGroup) -> None:
    model = mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.fp16
    )
    backward(model)
    opt.step()
    group.abort("broken after the step (test)")
    with pytest.raises(hvd.HorovodInternalError, match="broken after the step"):
        basics.current().check_host_updates()


def test_refusals(group: RoundGroup) -> None:
    def sgd() -> torch.optim.Optimizer:
        return torch.optim.SGD(mlp().parameters(), lr=0.1)

    with pytest.raises(NotImplementedError, match="op=Adasum"):
        hvd.DistributedOptimizer(sgd(), op=hvd.Adasum)
    with pytest.raises(ValueError, match="needs op=Average"):
        hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0)


def test_a_dropped_optimizer_leaves_no_working_hooks(group: RoundGroup) -> None:
    model = mlp()
    reference = copy.deepcopy(model)
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    before = step_weight.passes()
    backward(model)  # the optimizer is gone: plain local gradients, no pass counted
    backward(reference)
    assert step_weight.passes() == before
    for got, want in zip(grads(model), grads(reference), strict=True):
        torch.testing.assert_close(got, want)


def test_autograd_grad_reduces_nothing(group: RoundGroup) -> None:
    """Gradients computed with ``torch.autograd.grad`` are not accumulated: no pass, no
    reduction, no gradient set."""
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    before = step_weight.passes()
    torch.manual_seed(1)
    loss = model(torch.randn(4, 3)).square().mean()
    torch.autograd.grad(loss, list(model.parameters()))
    assert step_weight.passes() == before
    assert all(p.grad is None for p in model.parameters())
    assert opt._ej_reducer.reductions == 0  # type: ignore[attr-defined]


def test_a_backward_blocked_on_a_silent_peer_raises_when_the_round_is_aborted(
    group: RoundGroup, silent_peer: subprocess.Popen[str]
) -> None:
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    failed = "a member of round 1 failed"
    raises_when_aborted(group, lambda: backward(model), hvd.HorovodInternalError, failed)

    # The next round forms at once; the optimizer drops the broken round's reductions.
    basics.current().reset()
    opt.zero_grad()
    backward(model)
    opt.step()
