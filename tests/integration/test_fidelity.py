"""Elasticity does not change the training: the same loop (``workers/fidelity_worker.py``)
written with plain torch and with elasticjob's elastic state ends with the same parameters
and optimizer state, before a failure and after its rollback, with real processes over Gloo
on loopback. (Schedules and loss scales kept in a state are followed through a SIGKILL and a
scale-out in ``test_global_batch.py``.)

Where the two cannot be equal bit for bit by construction (a DDP or ``DistributedOptimizer``
average over three ranks: torch's DDP multiplies each gradient by 1/3 before its allreduce,
elasticjob divides the sum, and the buckets it reduces carry one more element, which moves
the allreduce's chunk boundaries), they are compared within floating-point reordering, and
the optimizers' step counts exactly (``docs/worker-runtime.md``, "Fidelity")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.job_runs import WORKERS, JobRun, loopback_hosts, run_job

pytestmark = pytest.mark.integration

FIDELITY_WORKER = WORKERS / "fidelity_worker.py"
STEPS, COMMIT_EVERY = 12, 3
PLAIN_DEADLINE_S = 180.0
"""Longest a plain run may take (its processes give up on a missing peer after 60 s)."""
STACKS_BEFORE_S = 10.0
"""How long before that deadline a plain process writes its threads' stacks to its log."""


def run_plain(tmp_path: Path, world: int, *worker_args: str) -> None:
    """The plain torch loop over ``world`` processes (``init_process_group``, no elasticjob),
    forked from one that imported torch, meeting through a file store of their own: no port
    to race other tests for. They write to a log file (a pipe nobody reads while a peer runs
    would stall it when full), and their Python stacks there when they run out of time."""
    stores = tmp_path / "stores"
    stores.mkdir(exist_ok=True)
    run = len(list(stores.iterdir()))
    store = stores / f"{world}-{run}"
    store.mkdir()
    command = [sys.executable, str(FIDELITY_WORKER), "--log-dir", str(tmp_path / "events")]
    command += ["--mode", "plain", "--store", str(store / "store"), "--ranks", str(world)]
    command += ["--stacks-after", str(PLAIN_DEADLINE_S - STACKS_BEFORE_S), *worker_args]
    log = store / "ranks.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        process.wait(timeout=PLAIN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, log.read_text()[-8000:]


def run_elastic(tmp_path: Path, world: int, *worker_args: str, min_np: int) -> JobRun:
    """The elastic loop under the launcher: one slot on each of ``world`` hosts (a failure
    blacklists its host)."""
    launcher = ["-np", str(world), "--min-np", str(min_np), "-H", loopback_hosts(world)]
    run = run_job(
        tmp_path,
        launcher_args=launcher,
        worker_args=["--mode", "elastic", *worker_args],
        script=FIDELITY_WORKER,
    )
    assert run.returncode == 0, run.explain()
    return run


def ends(tmp_path: Path, name: str, world: int) -> list[dict[str, Any]]:
    """Each rank's parameters and optimizer state in the dumps ``<name>-rank-<rank>.pt``."""
    events = tmp_path / "events"
    return [torch.load(events / f"{name}-rank-{rank}.pt") for rank in range(world)]


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


def adamw_steps(end: dict[str, Any]) -> list[int]:
    """AdamW's step count of every parameter (of the models trained with AdamW)."""
    return [
        int(value)
        for model in ("distopt-adamw", "ddp-adamw", "fp32", "bf16")
        for key, value in end.get(model, {}).get("optimizer", {}).items()
        if key.endswith(".step")
    ]


@pytest.mark.parametrize(
    ("family", "optimizer"),
    [("torch", "adamw"), ("sharded", "adamw"), ("sharded", "sgd")],
    ids=["torch-state", "sharded-adamw", "sharded-sgd"],
)
def test_the_elastic_state_trains_as_the_plain_loop_before_and_after_a_rollback(
    tmp_path: Path, family: str, optimizer: str
) -> None:
    """Three workers commit every 3 steps. The commit of step 6 equals the plain loop's end
    after 6 steps over 3 processes: bit for bit for the sharded state (FSDP2, fp32 and bf16
    mixed precision), within floating-point reordering for the torch state (see the module
    docstring), AdamW's step counts exact (the sharded state's first snapshot used to step
    the empty optimizer on zero gradients: 7 after 6 steps). Rank 1 is then SIGKILLed at
    step 7: the two survivors roll back to that commit (resharded onto two ranks, for the
    sharded state) and end bit for bit as the plain loop restarted from it on 2 processes,
    torch's DDP loading it or FSDP2 loading a DCP checkpoint of it. The torch family trains
    AdamW (weight decay) and SGD (momentum) models side by side, under
    ``DistributedOptimizer`` and under the elastic DDP."""
    loop = ["--family", family, "--optimizer", optimizer]  # the torch family trains both
    run = run_elastic(
        tmp_path, 3, *loop, "--steps", str(STEPS), "--commit-every", str(COMMIT_EVERY),
        "--fail", "7:1", "--save-commit", "6", min_np=2,
    )  # fmt: skip
    resumed = [e for e in run.of("step") if e["round"] == 2]
    assert resumed and min(e["step"] for e in resumed) == 6, run.explain()
    assert {e["size"] for e in resumed} == {2}
    run_plain(tmp_path, 3, *loop, "--steps", "6")
    for rank, (plain, commit) in enumerate(
        zip(ends(tmp_path, "plain-3-from-0", 3), ends(tmp_path, "commit", 3), strict=True)
    ):
        assert set(adamw_steps(commit)) == ({6} if optimizer != "sgd" else set()), rank
        assert not differences(plain, commit, exact=family == "sharded"), rank
    commit = tmp_path / "events" / "commit"
    run_plain(tmp_path, 2, *loop, "--steps", str(STEPS), "--resume-from", str(commit),
              "--start-step", "6")  # fmt: skip
    for rank, (plain, end) in enumerate(
        zip(ends(tmp_path, "plain-2-from-6", 2), ends(tmp_path, "elastic", 2), strict=True)
    ):
        assert set(adamw_steps(end)) == ({STEPS} if optimizer != "sgd" else set()), rank
        assert not differences(plain, end, exact=True), rank
