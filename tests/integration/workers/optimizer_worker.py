"""Worker script of the DistributedOptimizer tests: writes what every rank observed to
``<out>/rank-<rank>.json``.

Every check trains a small model with ``hvd.DistributedOptimizer`` and an independent
reference: a plain optimizer whose gradients are averaged with ``hvd.allreduce`` at the step
(the reduce-at-step the optimizer did before it reduced from backward hooks). Every
``torch.distributed.all_reduce`` call is counted, so the checks can tell when reductions
were launched. With ``--abort``, the job instead runs an elastic loop in which rank 2 of the
first round SIGKILLs itself in the middle of a backward pass; every rank appends JSON lines
(with wall-clock times) to ``<out>/events-<pid>.jsonl``.
"""

from __future__ import annotations

import copy
import os
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from api_worker import (  # beside this script
    batch,
    event_log,
    max_diff,
    mlp,
    params_digest,
    run_checks_or_abort,
    write_results,
)

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.training import step_weight

Json = dict[str, Any]

LAUNCHED = [0]
"""``torch.distributed.all_reduce`` calls so far."""
_all_reduce = dist.all_reduce


def _counting_all_reduce(*args: Any, **kwargs: Any) -> Any:
    LAUNCHED[0] += 1
    return _all_reduce(*args, **kwargs)


dist.all_reduce = _counting_all_reduce  # type: ignore[assignment]

PROBE: list[Callable[[], None]] = []
"""What the probe layer does when backward reaches it (the first layer is still to come)."""


class _Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        for action in PROBE:
            action()
        return grad


class Probe(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Probe.apply(x)  # type: ignore[no-any-return]


def probed(seed: int) -> torch.nn.Sequential:
    """Three layers with a probe between the first and the second."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 16),
        torch.nn.Tanh(),
        Probe(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    )


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def averaged(model: torch.nn.Module) -> None:
    """The reference's reduction: every gradient averaged at the step (zeros if None)."""
    for p in model.parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        p.grad = hvd.allreduce(grad.to_dense() if grad.is_sparse else grad)


def messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught]


# ---- checks ----------------------------------------------------------------------------


def overlap_checks(r: int) -> Json:
    """One bucket per parameter: by the time backward reaches the probe, the buckets of the
    two last layers are launched; backward launches the rest; step launches nothing."""
    model = probed(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0)
    start = LAUNCHED[0]
    seen: list[int] = []
    PROBE.append(lambda: seen.append(LAUNCHED[0] - start))
    loss_of(model, *batch(r, 4)).backward()
    PROBE.clear()
    by_end = LAUNCHED[0] - start
    opt.step()
    return {
        "buckets": len(opt._ej_reducer.plan),  # type: ignore[attr-defined]
        "launched_at_probe": seen,
        "launched_by_end_of_backward": by_end,
        "launched_by_step": LAUNCHED[0] - start - by_end,
    }


def equality_checks(r: int) -> Json:
    """Three momentum-SGD steps on per-rank batches of different sizes, per bucket layout."""
    layouts: dict[str, Callable[[torch.nn.Module], Json]] = {
        "default": lambda m: {},
        "one_bucket_per_parameter": lambda m: {"bucket_cap_mb": 0},
        "num_groups": lambda m: {"num_groups": 2},
        "groups": lambda m: {"groups": [[m[0].weight, m[5].bias]]},
        "predivide": lambda m: {"gradient_predivide_factor": 4.0},
    }
    out: Json = {}
    for name, options in layouts.items():
        model = probed(2)
        reference = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), **options(model)
        )
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            x, y = batch(100 * step + r, 2 + r)
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
            ref_opt.zero_grad()
            loss_of(reference, x, y).backward()
            averaged(reference)
            ref_opt.step()
        out[name] = {
            "max_diff": max_diff(model, reference),
            "moved": max_diff(model, probed(2)),
            "params": params_digest(model),
        }
    return out


def clipping_checks(r: int) -> Json:
    """Horovod's gradient-clipping recipe (synchronize, clip, step in skip_synchronize), and
    a step after synchronize() outside skip_synchronize (warns, reduces nothing again)."""
    out: Json = {}
    for variant in ("skip_synchronize", "plain_step"):
        model = mlp(3)
        reference = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        launched_by_step = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(2):
                x, y = batch(200 * step + r, 3)
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                before = LAUNCHED[0]
                if variant == "skip_synchronize":
                    with opt.skip_synchronize():  # type: ignore[attr-defined]
                        opt.step()
                else:
                    opt.step()
                launched_by_step.append(LAUNCHED[0] - before)
                ref_opt.zero_grad()
                loss_of(reference, x, y).backward()
                averaged(reference)
                torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
                ref_opt.step()
        out[variant] = {
            "max_diff": max_diff(model, reference),
            "moved": max_diff(model, mlp(3)),
            "launched_by_step": launched_by_step,
            "warnings": messages(caught),
        }
    return out


def accumulation_checks(r: int) -> Json:
    """backward_passes_per_step=3: nothing leaves the rank until the third pass; the sum of
    the three passes' gradients is averaged across ranks (Horovod's semantics)."""
    model = mlp(4)
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        backward_passes_per_step=3,
        bucket_cap_mb=0,
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    launched: list[list[int]] = []
    zero_grad_between = None
    for step in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        start, counts = LAUNCHED[0], []
        for k in range(3):
            x, y = batch(300 * step + 10 * k + r, 2 + k)
            loss_of(model, x, y).backward()
            counts.append(LAUNCHED[0] - start)
            loss_of(reference, x, y).backward()
            if step == 0 and k == 0:
                try:
                    opt.zero_grad()
                except RuntimeError as exc:
                    zero_grad_between = str(exc)
        launched.append(counts)
        opt.step()
        averaged(reference)
        ref_opt.step()
    return {
        "buckets": len(opt._ej_reducer.plan),  # type: ignore[attr-defined]
        "launched_after_each_pass": launched,
        "zero_grad_between": zero_grad_between,
        "max_diff": max_diff(model, reference),
        "moved": max_diff(model, mlp(4)),
    }


class Weights:
    """A step-weight source with fixed weights per pass."""

    def __init__(self, *weights: float) -> None:
        self.start = step_weight.passes()
        self.weights = weights

    def weight(self, passes: int) -> float:
        return self.weights[passes - self.start]


def weighted_checks(r: int, n: int) -> Json:
    """Step weights (the elastic sampler's uneven last batches): rank r's pass weighs
    (r + 1) / n, rank 0's second pass 0 (a padding sample); the result is
    sum(w_r * g_r) / sum(w_r), the same on every rank."""
    model = mlp(9)
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    weights = [(r + 1) / n, 0.0 if r == 0 else 1.0]
    step_weight.set_source(Weights(*weights))
    try:
        for step, w in enumerate(weights):
            x, y = batch(700 * step + r, 3)
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
            ref_opt.zero_grad()
            loss_of(reference, x, y).backward()
            total = hvd.allreduce(torch.tensor([w]), op=hvd.Sum)
            for p in reference.parameters():
                assert p.grad is not None
                p.grad = hvd.allreduce(p.grad * w, op=hvd.Sum) / total
            ref_opt.step()
    finally:
        step_weight.set_source(None)
    return {"max_diff": max_diff(model, reference), "params": params_digest(model)}


class Branchy(torch.nn.Module):
    """A trunk and head every rank uses, a branch only rank 1 uses, a layer none uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.trunk = torch.nn.Linear(5, 7)
        self.branch = torch.nn.Linear(7, 3)
        self.unused = torch.nn.Linear(7, 3)
        self.head = torch.nn.Linear(7, 3)

    def forward(self, x: torch.Tensor, with_branch: bool) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        return self.head(h) + self.branch(h) if with_branch else self.head(h)


def none_grad_checks(r: int) -> Json:
    """Gradients that are None on some ranks are reduced as zeros there (Horovod)."""
    model, reference = Branchy(), Branchy()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), bucket_cap_mb=0
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = batch(400 * step + r, 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, r == 1), y).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x, r == 1), y).backward()
        averaged(reference)
        ref_opt.step()
    branch_grad = model.branch.weight.grad
    return {
        "max_diff": max_diff(model, reference),
        "params": params_digest(model),
        "branch_moved": float((model.branch.weight - Branchy().branch.weight).abs().max()),
        "branch_grad_nonzero": branch_grad is not None and bool(branch_grad.abs().sum() > 0),
        "unused_moved": float((model.unused.weight - Branchy().unused.weight).abs().max()),
    }


class Bag(torch.nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.embedding = torch.nn.Embedding(10, 4, sparse=sparse)
        self.out = torch.nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embedding(ids))


def sparse_checks(r: int) -> Json:
    """A sparse embedding gradient is reduced densely, with a warning, and stays sparse."""
    model, reference = Bag(sparse=True), Bag(sparse=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            ids = torch.tensor([r, r + step + 1, 7])
            y = torch.full((3, 3), float(r))
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(ids), y).backward()
            opt.step()
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(reference(ids), y).backward()
            averaged(reference)
            ref_opt.step()
    grad = model.embedding.weight.grad
    return {
        "warnings": messages(caught),
        "grad_is_sparse": grad is not None and grad.is_sparse,
        "max_diff": max_diff(model, reference),
        "params": params_digest(model),
    }


def amp_checks(r: int) -> Json:
    """torch.amp.GradScaler with an inf injected on rank 1 only at step 1: Horovod's recipe,
    and scaler.step() without synchronize(); every rank skips that step, none hangs."""
    out: Json = {}
    for variant in ("recipe", "plain"):
        model = mlp(7)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
        scales, digests = [], []
        started = time.monotonic()
        for step in range(4):
            x, y = batch(500 * step + r, 4)
            if r == 1 and step == 1:
                x[0, 0] = float("inf")
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            if variant == "recipe":
                opt.synchronize()  # type: ignore[attr-defined]
                scaler.unscale_(opt)
                with opt.skip_synchronize():  # type: ignore[attr-defined]
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
            digests.append(params_digest(model))
        out[variant] = {
            "scales": scales,
            "digests": digests,
            "finite": all(bool(p.isfinite().all()) for p in model.parameters()),
            "seconds": time.monotonic() - started,
        }
    return out


def run() -> Json:
    """This rank's results, from init to shutdown."""
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    results: Json = {
        "rank": r,
        "size": n,
        "overlap": overlap_checks(r),
        "equality": equality_checks(r),
        "clipping": clipping_checks(r),
        "accumulation": accumulation_checks(r),
        "weighted": weighted_checks(r, n),
        "none_grads": none_grad_checks(r),
        "sparse": sparse_checks(r),
        "amp": amp_checks(r),
    }
    hvd.shutdown()
    return results


def values_run(out: Path) -> None:
    results = run()
    write_results(out, results["rank"], results)


# ---- abort -----------------------------------------------------------------------------


def abort_run(out: Path) -> None:
    event = event_log(out)

    def kill() -> None:
        event("kill", launched=LAUNCHED[0])
        os.kill(os.getpid(), signal.SIGKILL)

    hvd.init()
    model = probed(8)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.step < 6:
            if hvd.size() == 3 and hvd.rank() == 2 and state.step == 2:
                PROBE.append(kill)  # after the two last layers' buckets are launched
            x, y = batch(600 * state.step + hvd.rank(), 4)
            opt.zero_grad()
            where = "backward"
            try:
                loss_of(model, x, y).backward()
                where = "step"
                opt.step()
            except hvd.HorovodInternalError as exc:
                event("raised", waiting_in=where, error=str(exc))
                raise
            state.step += 1
            state.commit()

    train(state)
    event("done", step=state.step, params=params_digest(model))
    hvd.shutdown()


if __name__ == "__main__":
    run_checks_or_abort(values_run, abort_run)
