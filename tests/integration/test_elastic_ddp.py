"""The elastic ``DistributedDataParallel`` and the sampler's uneven last batches, across real
processes (Gloo over loopback, under ``elasticjob-run``).

``ddp_worker.py`` trains with a plain mean loss and no masking; the only accounting is what
the step weights say was trained. Two jobs:

- a steady one, 3 workers on two hosts: the committed trajectory trains every sample of each
  epoch exactly once, and the model equals one process replaying that trajectory;
- a faulty one with a 60 s collective timeout: rank 2 SIGKILLs itself in the middle of a
  backward pass while a forked child holds its sockets open (no connection reset reaches
  the others, as when a node loses power or network), its host is blacklisted (2
  survivors), then a host is added (3 workers). The driver's failure notice wakes the
  survivors' backward passes within seconds and they re-form in a new round well before the
  timeout; the DDP is rebuilt on each round's group; the committed trajectory is still exact
  and the model equals its replay.

And the torchrun-style example, ``examples/ddp_digits/train.py``, and its fixed-global-batch
variant, under the launcher.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from elasticjob.worker_contract import ENV_COLLECTIVE_TIMEOUT
from tests.integration.workers.ddp_model import SAMPLES, build_model, build_optimizer, data
from tests.support.job_runs import read_events, run_to_end, write_discovery
from tests.support.worker_scripts import HOSTS, launcher, worker_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
WORKER = Path(__file__).parent / "workers" / "ddp_worker.py"
EXAMPLE = ROOT / "examples" / "ddp_digits" / "train.py"
GLOBAL_BATCH_EXAMPLE = ROOT / "examples" / "ddp_digits" / "train_global_batch.py"
EPOCHS = 3
KILL_COLLECTIVE_TIMEOUT_S = 60
RAISED_WITHIN_S = 10.0
"""How soon after the kill the survivors' backward passes must raise."""
REFORMED_WITHIN_S = 15.0
"""How soon after the kill the survivors must train in a new round."""
HOLD_SOCKETS_S = 20.0
"""How long the killed worker's sockets stay open (past the survivors' re-forming)."""


@dataclass(frozen=True)
class Job:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]]
    result: dict[str, Any]

    def explain(self) -> str:
        return f"exit {self.returncode}\n{self.stderr[-5000:]}\n{self.stdout[-3000:]}"

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == kind]


def run_ddp_job(
    tmp_path: Path, launcher_args: list[str], worker_args: list[str], env: dict[str, str]
) -> Job:
    out = tmp_path / "results"
    command = launcher(*launcher_args, sys.executable, str(WORKER), "--out", str(out), *worker_args)
    returncode, stdout, stderr = run_to_end(command, tmp_path, env, 300.0)
    result_file = out / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    job = Job(returncode, stdout, stderr, read_events(out), result)
    assert returncode == 0 and result, job.explain()
    return job


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp_path = tmp_path_factory.mktemp("steady")
    return run_ddp_job(tmp_path, ["-np", "3", "-H", HOSTS], ["--epochs", str(EPOCHS)], worker_env())


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp_path = tmp_path_factory.mktemp("faulty")
    script, epoch_file = write_discovery(tmp_path, {0: HOSTS, 1: f"{HOSTS},127.0.1.3:1"})
    env = worker_env()
    env[ENV_COLLECTIVE_TIMEOUT] = str(KILL_COLLECTIVE_TIMEOUT_S)
    return run_ddp_job(
        tmp_path,
        [
            *("-np", "3", "--min-np", "2", "--max-np", "3"),
            *("--host-discovery-script", str(script)),
            *("--blacklist-cooldown-range", "600", "600"),  # the killed host stays out
        ],
        [
            *("--epochs", str(EPOCHS), "--kill", "0:3:2", "--step-time", "0.05"),
            *("--hold-sockets", str(HOLD_SOCKETS_S)),
            *("--expect-sizes", "2,3,3", "--epoch-file", str(epoch_file)),
        ],
        env,
    )


def replay(trajectory: list[dict[str, Any]]) -> list[list[float]]:
    """The weights after training one process on each step's samples, with the mean loss."""
    model = build_model()
    optimizer = build_optimizer(model)
    features, targets = data()
    for step in trajectory:
        index = torch.tensor(step["indices"])
        loss = torch.nn.functional.mse_loss(model(features[index]), targets[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def assert_every_sample_trained_once_per_epoch(job: Job) -> None:
    trajectory = job.result["trajectory"]
    for epoch in range(EPOCHS):
        trained = Counter(i for s in trajectory if s["epoch"] == epoch for i in s["indices"])
        assert sorted(trained) == list(range(SAMPLES)), f"epoch {epoch} missed samples"
        assert set(trained.values()) == {1}, f"epoch {epoch} trained samples twice: {trained}"


def assert_equals_the_replay(job: Job) -> None:
    expected = replay(job.result["trajectory"])
    for got, want in zip(job.result["params"], expected, strict=True):
        assert got == pytest.approx(want, abs=1e-5)


def test_steady_ddp_trains_each_sample_once_and_equals_one_process(steady: Job) -> None:
    assert_every_sample_trained_once_per_epoch(steady)
    assert_equals_the_replay(steady)
    steps = steady.of("step")
    assert {e["round"] for e in steps} == {1}
    # 97 samples, 3 ranks, batches of 4: 9 steps per epoch; the last one trains 1 sample
    # on rank 0 and a weight-0 padding sample on ranks 1 and 2.
    last = Counter((e["rank"], e["weight"], e["batch_len"]) for e in steps if e["batch"] == 8)
    assert last == {(0, 0.25, 1): EPOCHS, (1, 0.0, 0): EPOCHS, (2, 0.0, 0): EPOCHS}
    assert max(e["batch"] for e in steps) == 8
    assert all(e["on_round_group"] for e in steps)


def test_sigkill_in_backward_wakes_the_survivors_before_the_timeout(faulty: Job) -> None:
    (kill,) = faulty.of("kill")
    raised = faulty.of("raised")
    assert sorted(e["rank"] for e in raised) == [0, 1], faulty.explain()
    for e in raised:
        assert e["where"] == "backward"
        assert e["time"] - kill["time"] < RAISED_WITHIN_S, e
    reformed = min(
        e["time"] for e in faulty.of("train") if e["round"] > kill["round"] and e["size"] == 2
    )
    assert reformed - kill["time"] < REFORMED_WITHIN_S
    print(
        f"SIGKILL in backward, sockets held open: raised after "
        f"{max(e['time'] - kill['time'] for e in raised):.2f} s, re-formed after "
        f"{reformed - kill['time']:.2f} s (collective timeout {KILL_COLLECTIVE_TIMEOUT_S} s)"
    )


def test_the_driver_notice_wakes_the_backward_passes(faulty: Job) -> None:
    """No connection reset came: what woke the survivors is the driver's failure notice."""
    for e in faulty.of("raised"):
        assert "driver notice" in e["error"], e["error"]


def test_ddp_is_rebuilt_on_each_round_after_a_failure_and_a_scale_out(faulty: Job) -> None:
    steps = faulty.of("step")
    assert all(e["on_round_group"] for e in steps)
    sizes = {e["round"]: e["size"] for e in steps}
    ordered = [sizes[r] for r in sorted(sizes)]
    assert ordered[0] == 3 and 2 in ordered and ordered[-1] == 3, sizes
    for pid in {e["pid"] for e in steps}:
        mine = [e for e in steps if e["pid"] == pid]
        built = {e["round"]: e["ddp"] for e in mine}
        assert all(e["ddp"] == built[e["round"]] for e in mine), "rebuilt within a round"


def test_faulty_ddp_still_trains_each_sample_once_and_equals_one_process(faulty: Job) -> None:
    assert_every_sample_trained_once_per_epoch(faulty)
    assert_equals_the_replay(faulty)
    assert faulty.result["size"] == 3


def example_epochs(tmp_path: Path, example: Path, workers: int) -> tuple[list[str], str]:
    """Run an example for 2 epochs on ``workers`` loopback hosts: rank 0's epoch lines, and
    what explains a failure."""
    hosts = ",".join(f"127.0.1.{i}:1" for i in range(1, workers + 1))
    command = launcher(
        "-np", str(workers), "-H", hosts, sys.executable, str(example), "--epochs", "2"
    )
    returncode, stdout, stderr = run_to_end(command, tmp_path, worker_env(), 240.0)
    explain = f"exit {returncode}\n{stderr[-4000:]}\n{stdout[-4000:]}"
    assert returncode == 0, explain
    epochs = [line for line in stdout.splitlines() if "<stdout>:epoch " in line]
    assert len(epochs) == 2, explain
    assert all(f"{workers} workers" in line for line in epochs), explain
    assert all("each sample trained once: True" in line for line in epochs), explain
    return epochs, explain


def test_torchrun_style_example_trains_under_the_launcher(tmp_path: Path) -> None:
    example_epochs(tmp_path, EXAMPLE, 2)


def test_the_global_batch_example_trains_under_the_launcher(tmp_path: Path) -> None:
    """Three workers split each global batch of 128 unevenly (43, 43, 42 samples, two
    micro-batches each): 15 steps an epoch, every sample once."""
    epochs, explain = example_epochs(tmp_path, GLOBAL_BATCH_EXAMPLE, 3)
    assert "15 steps" in epochs[0] and "30 steps" in epochs[1], explain
