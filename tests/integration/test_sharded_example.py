"""The sharded language model example (``examples/sharded_lm/train.py``) under ``elasticjob-run``
on four loopback hosts: one worker is SIGKILLed from outside in the middle of an epoch; the
three survivors rebuild its shards from their copies, reshard the commit onto three and train
on; the job succeeds with the loss falling and every sequence trained exactly once per epoch.

The example stays as a user would run it: the test learns the victim's pid from the
launcher's own log (``--verbose``: "started worker HOST[0] (pid N)") and kills it when rank 0
logs the step chosen for the kill.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticjob.worker_contract import ENV_COLLECTIVE_TIMEOUT
from tests.support.worker_scripts import launcher, worker_env

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "examples" / "sharded_lm" / "train.py"
FOUR_HOSTS = "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1,127.0.1.4:1"
VICTIM_HOST = "127.0.1.4"
EPOCHS = 3
TINY = [
    *("--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "32", "--seq-len", "16"),
    *("--samples", "384", "--batch-size", "8", "--epochs", str(EPOCHS)),
    *("--commit-every", "5", "--log-every", "3", "--pace", "0.02"),
    *("--mixed-precision", "--tie-embeddings"),
]
"""A tiny model, in bfloat16 with its head tied to its embedding (the e2e test runs the
defaults)."""
KILL_AT = "[0]<stderr>:epoch 1 step 6:"
"""Rank 0's log line after which the victim is killed: mid-epoch, one step after the commit
of step 5 and four before the next."""
RESUMED_AT = (1, 5)
"""The epoch and step of the commit the survivors resume from."""
JOB_TIMEOUT_S = 180.0
COLLECTIVE_TIMEOUT_S = "900"
"""Beyond the job's deadline: no survivor may wait out the collective timeout inside one of
FSDP2's own collectives (the state lets go of a broken group, which fails them at once)."""

STARTED = re.compile(r"started worker (?P<host>[\d.]+)\[0\] \(pid (?P<pid>\d+)\)")
"""The launcher's debug line for each worker it starts."""
STEP_LINE = re.compile(r"\[0\]<stderr>:epoch (\d+) step (\d+): loss ([\d.]+)")
ROUND_LINE = re.compile(r"\[0\]<stderr>:round (\d+): (\d+) workers, from epoch (\d+) step (\d+)")
EPOCH_LINE = re.compile(r"\[0\]<stderr>:epoch (\d+) done: .* exactly once: (True|False)")


@dataclass(frozen=True)
class KilledRun:
    returncode: int
    output: str
    victim: int | None
    """The pid killed (None if the kill step never came)."""

    def explain(self) -> str:
        return f"exit {self.returncode}, victim {self.victim}\n{self.output[-8000:]}"


def run_and_kill(tmp_path: Path) -> KilledRun:
    """Run the example as a job of four, SIGKILL the worker on :data:`VICTIM_HOST` after
    rank 0 logs :data:`KILL_AT`, and wait for the job's end."""
    command = launcher(
        *("-np", "4", "--min-np", "3", "-H", FOUR_HOSTS, "--verbose"),
        *(sys.executable, str(EXAMPLE), *TINY),
    )
    env = worker_env()
    env[ENV_COLLECTIVE_TIMEOUT] = COLLECTIVE_TIMEOUT_S
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    victim: list[int] = []

    pids: dict[str, int] = {}

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if started := STARTED.search(line):
                pids[started["host"]] = int(started["pid"])
            if not victim and line.startswith(KILL_AT) and VICTIM_HOST in pids:
                os.kill(pids[VICTIM_HOST], signal.SIGKILL)
                victim.append(pids[VICTIM_HOST])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        returncode = process.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        returncode = process.wait()
        lines.append(f"\n[test] killed after {JOB_TIMEOUT_S} s\n")
    reader.join(timeout=10)
    (tmp_path / "output.txt").write_text("".join(lines))
    return KilledRun(returncode, "".join(lines), victim[0] if victim else None)


@pytest.mark.timeout(300)
def test_the_example_survives_a_sigkilled_worker_of_four(tmp_path: Path) -> None:
    started = time.monotonic()
    run = run_and_kill(tmp_path)
    assert run.victim is not None, f"the kill step never came: {run.explain()}"
    assert run.returncode == 0, run.explain()
    # The survivors resharded the last commit onto three, and went on from it, not from 0.
    assert re.search(
        r"resharded commit \d+ from 4 shards onto 3 shards in 1 replica", run.output
    ), run.explain()
    rounds = [tuple(map(int, m.groups())) for m in ROUND_LINE.finditer(run.output)]
    assert rounds[0] == (1, 4, 0, 0), rounds
    after = [r for r in rounds if r[0] > 1]
    assert after and after[0][1] == 3, rounds
    assert (after[0][2], after[0][3]) == RESUMED_AT, f"not resumed from the commit: {rounds}"
    # Every sequence exactly once in each epoch (the last round's word for each epoch).
    once = {int(epoch): word for epoch, word in EPOCH_LINE.findall(run.output)}
    assert once == dict.fromkeys(range(EPOCHS), "True"), run.explain()
    losses = [float(m.group(3)) for m in STEP_LINE.finditer(run.output)]
    assert losses[-1] < 0.8 * losses[0], losses
    print(f"killed pid {run.victim}; job done in {time.monotonic() - started:.1f} s; "
          f"rounds {rounds}; loss {losses[0]:.3f} -> {losses[-1]:.3f}")  # fmt: skip
