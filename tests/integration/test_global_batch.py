"""A fixed global batch across resizes (``GlobalBatchSampler`` and ``elastic.accumulate``),
with real processes over Gloo on loopback: an optimizer step means the same at 2, 3 or 4
workers, so an elastic run through a SIGKILL in the middle of a gradient accumulation and a
scale-out ends where one process training the same global batches without elasticjob ends,
within floating-point reordering; every sample of an epoch is trained once in the committed
trajectory; and the learning-rate schedules and the loss scale kept in the state follow
their plan at every step, on the survivors and on the newcomer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from elasticjob.worker_runtime.elastic.batch_plan import step_sizes
from elasticjob.worker_runtime.elastic.epoch_order import epoch_order
from tests.integration.workers.fidelity_worker import (
    SAMPLES,
    TORCH_MODELS,
    data,
    make_optimizer,
    make_scheduler,
    mlp,
    schedule_of,
)
from tests.support.job_runs import WORKERS, JobRun, loopback_hosts, run_job

pytestmark = pytest.mark.integration

GLOBAL_BATCH, MICRO_BATCH, EPOCHS, COMMIT_EVERY = 20, 4, 3, 3
"""96 samples in global batches of 20 (the last of an epoch: 16): 5 steps an epoch; 7, 7 and
6 samples a rank at 3 workers (2 micro-batches), 10 at 2 (3), 5 at 4 (2)."""
SEED = 5
"""The sampler's seed in the worker."""
STEPS = EPOCHS * len(step_sizes(SAMPLES, GLOBAL_BATCH))


def elastic_run(tmp_path: Path, family: str) -> JobRun:
    """Three workers on three hosts; rank 1 SIGKILLed before its second micro-batch of step 7
    (the survivors hold the first one's gradients); a fourth host from step 10 on, awaited at
    step 11."""
    run = run_job(
        tmp_path,
        launcher_args=["-np", "3", "--min-np", "2", "--max-np", "8"],
        worker_args=[
            "--family", family, "--global-batch", str(GLOBAL_BATCH),
            "--micro-batch", str(MICRO_BATCH), "--epochs", str(EPOCHS),
            "--commit-every", str(COMMIT_EVERY), "--fail", "7:1", "--await-size", "11:3",
        ],
        schedule={0: loopback_hosts(3), 10: loopback_hosts(4)},
        script=WORKERS / "global_batch_worker.py",
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    return run


def schedules(family: str, optimizers: dict[str, Any]) -> list[Any]:
    """The worker's schedulers: one per torch-family model (``mixed``), or the sharded
    ``build``'s ``SequentialLR``."""
    if family == "torch":
        return [make_scheduler(schedule_of(n, "mixed"), o, STEPS) for n, o in optimizers.items()]
    return [make_scheduler("sequential", next(iter(optimizers.values())), STEPS)]


def reference(family: str) -> tuple[dict[str, Any], list[list[float]]]:
    """One process, no elasticjob: each step's whole global batch in one backward pass, the
    same schedules. Returns the end, and the learning rates after each step."""
    features, targets = data()
    if family == "torch":
        models = {name: mlp(i) for i, name in enumerate(TORCH_MODELS)}
        optimizers = {n: make_optimizer(n.split("-")[1], m.parameters()) for n, m in models.items()}
    else:
        models = {"fp32": mlp(1), "bf16": mlp(2)}
        shared = make_optimizer("adamw", [p for m in models.values() for p in m.parameters()])
        optimizers = dict.fromkeys(models, shared)
    schedulers = schedules(family, optimizers)
    lrs = []
    for epoch in range(EPOCHS):
        order = epoch_order(SAMPLES, True, SEED, epoch)
        start = 0
        for size in step_sizes(SAMPLES, GLOBAL_BATCH):
            batch = order[start : start + size]
            start += size
            x, y = features[batch], targets[batch]
            loss = sum(torch.nn.functional.mse_loss(m(x), y) for m in models.values())
            loss.backward()  # type: ignore[union-attr]
            for optimizer in {id(o): o for o in optimizers.values()}.values():
                optimizer.step()
                optimizer.zero_grad()
            for scheduler in schedulers:
                scheduler.step()
            lrs.append([o.param_groups[0]["lr"] for o in optimizers.values()])
    end = {
        name: {
            "params": dict(model.named_parameters()),
            "optimizer": {
                f"{n}.{key}": value
                for n, p in model.named_parameters()
                for key, value in optimizers[name].state[p].items()
            },
        }
        for name, model in models.items()
    }
    return end, lrs


def committed_steps(run: JobRun) -> dict[int, list[dict[str, Any]]]:
    """The step events of the committed trajectory: for each step, those of the last round
    that took it."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for event in run.of("step"):
        steps.setdefault(event["step"], []).append(event)
    return {
        step: [e for e in events if e["round"] == max(x["round"] for x in events)]
        for step, events in sorted(steps.items())
    }


@pytest.mark.parametrize("family", ["torch", "sharded"])
def test_a_fixed_global_batch_trains_as_one_process_through_a_sigkill_and_a_scale_out(
    tmp_path: Path, family: str
) -> None:
    """The torch family: AdamW and SGD models under ``DistributedOptimizer`` and under the
    elastic DDP (``no_sync`` on the accumulation micro-batches), a StepLR, a LambdaLR, a
    OneCycleLR and a SequentialLR (one per model) and a GradScaler in the ``TorchState``; the
    sharded one: FSDP2 in fp32 (``set_requires_gradient_sync``) and in bf16 mixed precision
    (it trains but is compared with nothing: bf16 arithmetic is not fp32's), and a
    SequentialLR returned by ``build``. A rollback used to keep the gradients the survivors
    had accumulated in the step it undid; a restored scheduler used to be a copy bound to a
    copy of the optimizer, whose live rate then never changed again (and a scheduler of a
    ``DistributedOptimizer`` could not be synced at all: rank 0 failed to pickle it)."""
    run = elastic_run(tmp_path, family)
    steps = committed_steps(run)
    assert sorted(steps) == list(range(STEPS)), run.explain()
    assert {e["size"] for e in steps[7]} == {2}, "step 7 is retaken by the 2 survivors"
    # A newcomer trains the last steps (and the killed host too, once its blacklisting has
    # expired: on a loaded machine the run outlasts it).
    assert max(e["size"] for e in steps[STEPS - 1]) >= 3, "a newcomer trains the last steps"
    assert {e["micro_batches"] for e in steps[7]} == {3} and {
        e["micro_batches"] for e in steps[0]
    } == {2}
    for epoch in range(EPOCHS):
        order = epoch_order(SAMPLES, True, SEED, epoch)
        first = epoch * len(step_sizes(SAMPLES, GLOBAL_BATCH))
        start = 0
        for offset, size in enumerate(step_sizes(SAMPLES, GLOBAL_BATCH)):
            trained = sorted(i for e in steps[first + offset] for i in e["samples"])
            assert trained == sorted(order[start : start + size]), (epoch, offset)
            start += size

    expected, lrs = reference(family)
    for event in run.of("step"):
        assert event["lr"] == lrs[event["step"]], event
        if family == "torch":  # x2 every 2 steps (no overflow here)
            assert event["scale"] == 4.0 * 2 ** ((event["step"] + 1) // 2), event
    end = torch.load(tmp_path / "events" / "end.pt")
    compared = [name for name in expected if name != "bf16"]
    assert compared and all(name in end for name in expected)
    for name in compared:
        for part in ("params", "optimizer"):
            assert end[name][part].keys() == expected[name][part].keys(), (name, part)
            for key, want in expected[name][part].items():
                got = end[name][part][key]
                if key.endswith(".step"):
                    assert float(got) == float(want) == STEPS, (name, key)
                else:
                    torch.testing.assert_close(
                        got, want.detach(), rtol=1e-4, atol=1e-5, msg=f"{name} {part} {key}"
                    )
