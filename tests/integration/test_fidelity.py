"""Elasticity does not change the training: the same loop (``workers/fidelity_worker.py``)
written with plain torch and with elasticjob's elastic state ends with the same parameters
and optimizer state, with real processes over Gloo on loopback; schedules and loss scales
kept in the state follow their plan through a SIGKILL.

Where the two cannot be equal bit for bit by construction (a DDP or ``DistributedOptimizer``
average over three ranks: torch's DDP multiplies each gradient by 1/3 before its allreduce,
elasticjob divides the sum, and the buckets it reduces carry one more element, which moves
the allreduce's chunk boundaries), they are compared within floating-point reordering, and
the optimizers' step counts exactly (``docs/worker-runtime.md``, "Fidelity")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.workers import fidelity_worker as worker
from tests.support.job_runs import WORKERS, JobRun, run_job

pytestmark = pytest.mark.integration

FIDELITY_WORKER = WORKERS / "fidelity_worker.py"
STEPS, COMMIT_EVERY = 12, 3


def run_plain(tmp_path: Path, world: int, *worker_args: str) -> None:
    """The plain torch loop over ``world`` processes (``init_process_group``, no elasticjob)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, str(FIDELITY_WORKER), "--log-dir", str(tmp_path / "events")]
    processes = [
        subprocess.Popen(
            [*command, "--mode", "plain", *worker_args],
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in processes]
    assert all(p.returncode == 0 for p in processes), "\n".join(outputs)


def run_elastic(tmp_path: Path, world: int, *worker_args: str, min_np: int = 0) -> JobRun:
    """The elastic loop under the launcher: ``world`` slots on one host, or with ``min_np``
    one slot on each of ``world`` hosts (a failure blacklists its host)."""
    if min_np:
        hosts = ",".join(f"127.0.1.{i}:1" for i in range(1, world + 1))
        launcher = ["-np", str(world), "--min-np", str(min_np), "-H", hosts]
    else:
        launcher = ["-np", str(world), "-H", f"127.0.1.1:{world}"]
    run = run_job(
        tmp_path,
        launcher_args=launcher,
        worker_args=["--mode", "elastic", *worker_args],
        script=FIDELITY_WORKER,
    )
    assert run.returncode == 0, run.explain()
    return run


def ends(tmp_path: Path, mode: str, world: int) -> list[dict[str, Any]]:
    """Each rank's parameters and optimizer state at the end of a ``mode`` run."""
    events = tmp_path / "events"
    return [torch.load(events / f"{mode}-rank-{rank}.pt") for rank in range(world)]


def differences(plain: dict[str, Any], elastic: dict[str, Any], exact: bool) -> list[str]:
    """Where the elastic end differs from the plain one: bit for bit (``exact``), or beyond
    floating-point reordering; a step count or a learning rate must always be equal."""
    found = []
    assert plain.keys() == elastic.keys()
    for model in plain:
        assert plain[model]["lr"] == elastic[model]["lr"], model
        for part in ("params", "optimizer"):
            ours, theirs = elastic[model][part], plain[model][part]
            assert ours.keys() == theirs.keys(), (model, part, ours.keys(), theirs.keys())
            for name, value in theirs.items():
                got = ours[name]
                if name.endswith(".step") or not isinstance(value, torch.Tensor):
                    same = (
                        torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
                    )
                    if not same:
                        found.append(f"{model} {name}: {got} != {value}")
                elif exact and not torch.equal(got, value):
                    delta = (got.float() - value.float()).abs().max().item()
                    found.append(f"{model} {part} {name}: not bit-identical (max |diff| {delta:g})")
                elif not torch.allclose(got.float(), value.float(), rtol=1e-4, atol=1e-6):
                    delta = (got.float() - value.float()).abs().max().item()
                    found.append(f"{model} {part} {name}: max |diff| {delta:g}")
    return found


@pytest.mark.parametrize("world", [2, 3])
def test_the_elastic_torch_state_trains_as_plain_ddp(tmp_path: Path, world: int) -> None:
    """AdamW (weight decay) and SGD (momentum), under ``DistributedOptimizer`` and the elastic
    DDP, commits every 3 steps: the same end as torch's DDP. Bit for bit over 2 processes
    (halving is exact); within floating-point reordering over 3, step counts exact."""
    args = ["--family", "torch", "--steps", str(STEPS), "--commit-every", str(COMMIT_EVERY)]
    run_plain(tmp_path, world, *args)
    run_elastic(tmp_path, world, *args)
    for rank, (plain, elastic) in enumerate(
        zip(ends(tmp_path, "plain", world), ends(tmp_path, "elastic", world), strict=True)
    ):
        for model in ("distopt-adamw", "ddp-adamw"):
            steps = {k: v for k, v in elastic[model]["optimizer"].items() if k.endswith(".step")}
            assert steps and all(int(v) == STEPS for v in steps.values()), (model, steps)
        assert not differences(plain, elastic, exact=world == 2), (rank, world)


@pytest.mark.parametrize(("world", "optimizer"), [(2, "sgd"), (3, "adamw")])
def test_the_sharded_state_trains_as_plain_fsdp2(
    tmp_path: Path, world: int, optimizer: str
) -> None:
    """FSDP2 with and without a bf16 ``MixedPrecisionPolicy``, commits every 3 steps: bit for
    bit the same end as the plain FSDP2 loop, AdamW's step count that of the steps taken
    (the state's first snapshot used to step the empty optimizer on zero gradients: 13
    after 12 steps). SGD over 2 processes and AdamW over 3 (the other two pairs end alike
    too: two runs keep each optimizer and each world size covered)."""
    args = ["--family", "sharded", "--optimizer", optimizer, "--steps", str(STEPS),
            "--commit-every", str(COMMIT_EVERY)]  # fmt: skip
    run_plain(tmp_path, world, *args)
    run_elastic(tmp_path, world, *args)
    for rank, (plain, elastic) in enumerate(
        zip(ends(tmp_path, "plain", world), ends(tmp_path, "elastic", world), strict=True)
    ):
        if optimizer == "adamw":
            steps = [v for k, v in elastic["fp32"]["optimizer"].items() if k.endswith(".step")]
            assert steps and all(int(v) == STEPS for v in steps), steps
        assert not differences(plain, elastic, exact=True), rank


def expected_lrs(kind: str, optimizer: str, steps: int) -> list[float]:
    """The learning rate after each step's ``scheduler.step()``, from an uninterrupted
    schedule."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = worker.make_optimizer(optimizer, [param])
    scheduler = worker.make_scheduler(kind, opt, steps)
    lrs = []
    for _ in range(steps):
        opt.step()
        scheduler.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_schedules_and_loss_scales_kept_in_a_torch_state_survive_a_sigkill(
    tmp_path: Path,
) -> None:
    """Three workers, rank 1 SIGKILLed at step 7 (commit every 3), a StepLR, a LambdaLR, a
    OneCycleLR and a SequentialLR (one per model): after the rollback every optimizer's live
    learning rate follows its schedule at every step, and the GradScaler's scale its growth
    (x2 every 2 steps). A restored scheduler is the script's own, bound to the live optimizer
    (it used to be a copy bound to a copy of the optimizer, whose live rate then never
    changed again; and a scheduler of a ``DistributedOptimizer`` could not be synced at all:
    rank 0 failed to pickle it in every round)."""
    run = run_elastic(
        tmp_path, 3, "--family", "torch", "--scheduler", "mixed", "--grad-scaler",
        "--steps", str(STEPS), "--commit-every", str(COMMIT_EVERY), "--fail", "7:1",
        min_np=2,
    )  # fmt: skip
    steps = run.of("step")
    assert {e["round"] for e in steps} == {1, 2}, run.explain()
    assert {e["step"] for e in steps if e["round"] == 2} == set(range(6, STEPS))
    lrs = [
        expected_lrs(worker.schedule_of(name, "mixed"), name.split("-")[1], STEPS)
        for name in worker.TORCH_MODELS
    ]
    for event in steps:
        assert event["lr"] == [schedule[event["step"]] for schedule in lrs], event
        assert event["scale"] == 4.0 * 2 ** ((event["step"] + 1) // 2), event


def test_a_schedule_returned_by_the_sharded_build_survives_a_sigkill(tmp_path: Path) -> None:
    """``build(mesh)`` returns the scheduler of the optimizer it makes: every round's new one
    gets the committed schedule, on survivors and on the ranks of the resharded world."""
    run = run_elastic(
        tmp_path, 3, "--family", "sharded", "--scheduler", "sequential", "--steps", str(STEPS),
        "--commit-every", str(COMMIT_EVERY), "--fail", "7:1", min_np=2,
    )  # fmt: skip
    steps = run.of("step")
    assert {e["round"] for e in steps} == {1, 2}, run.explain()
    lrs = expected_lrs("sequential", "adamw", STEPS)
    for event in steps:
        assert event["lr"] == [lrs[event["step"]]], event
