"""The environment scripts read (horovodrun's and torchrun's variables) and the default
``torch.distributed`` group, round after round, under ``elasticjob-run``: a scale-out (a host
added by discovery) and a failure (SIGKILL of a worker).

Every process logs its script variables at launch (Horovod's variables of its planned place
already set, as horovodrun sets them), right after ``init()`` and after every reset, with
``torch.distributed``'s view and an ``all_reduce`` on the default group; each round's records
must match the round's rank, size, local and cross values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticjob.script_env import (
    ENV_HOROVOD_CROSS_RANK,
    ENV_HOROVOD_CROSS_SIZE,
    ENV_HOROVOD_LOCAL_SIZE,
    ENV_HOROVOD_RANK,
    ENV_HOROVOD_SIZE,
    ENV_TORCH_GROUP_RANK,
    ENV_TORCH_LOCAL_WORLD_SIZE,
    ENV_TORCH_MASTER_ADDR,
    ENV_TORCH_MASTER_PORT,
    ENV_TORCH_RANK,
    ENV_TORCH_RUN_ID,
    ENV_TORCH_WORLD_SIZE,
    HOROVOD_PLACE_ENV,
)
from elasticjob.worker_contract import (
    ENV_HOROVOD_HOSTNAME,
    ENV_HOROVOD_LOCAL_RANK,
    ENV_TORCH_LOCAL_RANK,
)
from tests.support.job_runs import JobRun, run_job

pytestmark = pytest.mark.integration

OLD, NEW = "127.0.1.1", "127.0.1.2"
ROUNDS: dict[int, dict[tuple[str, int], int]] = {
    1: {(OLD, 0): 0, (OLD, 1): 1},
    2: {(OLD, 0): 0, (OLD, 1): 1, (NEW, 0): 2, (NEW, 1): 3},
    3: {(OLD, 0): 0, (OLD, 1): 1},
}
"""The ranks of every round of the first test."""


def expected_env(round_ranks: dict[tuple[str, int], int], host: str, slot: int) -> dict[str, str]:
    hosts = list(dict.fromkeys(h for h, _ in sorted(round_ranks, key=round_ranks.__getitem__)))
    size, local_size = len(round_ranks), sum(1 for h, _ in round_ranks if h == host)
    cross = [h for h in hosts if (h, slot) in round_ranks]
    values = {
        ENV_HOROVOD_HOSTNAME: host,
        ENV_HOROVOD_LOCAL_RANK: slot,
        ENV_TORCH_LOCAL_RANK: slot,
        ENV_HOROVOD_RANK: round_ranks[host, slot],
        ENV_TORCH_RANK: round_ranks[host, slot],
        ENV_HOROVOD_SIZE: size,
        ENV_TORCH_WORLD_SIZE: size,
        ENV_HOROVOD_LOCAL_SIZE: local_size,
        ENV_TORCH_LOCAL_WORLD_SIZE: local_size,
        ENV_HOROVOD_CROSS_RANK: cross.index(host),
        ENV_TORCH_GROUP_RANK: cross.index(host),
        ENV_HOROVOD_CROSS_SIZE: len(cross),
        ENV_TORCH_MASTER_ADDR: OLD,  # rank 0's host
    }
    return {name: str(value) for name, value in values.items()}


def records(run: JobRun, phase: str) -> list[dict[str, Any]]:
    return [e for e in run.of("env") if e["phase"] == phase]


def check_rounds(run: JobRun, rounds: dict[int, dict[tuple[str, int], int]]) -> None:
    """Every member's records of every round match the round (``rounds``: the ranks)."""
    # Launch: the host and slot are in the environment before init(), and, as horovodrun
    # sets them, Horovod's variables of the place planned for the worker's first round.
    for record in records(run, "launch"):
        env = record["env"]
        assert env[ENV_HOROVOD_HOSTNAME] == record["host"], record
        assert env[ENV_HOROVOD_LOCAL_RANK] == env[ENV_TORCH_LOCAL_RANK]
        assert env[ENV_TORCH_LOCAL_RANK] == str(record["slot"]), record
        where = (record["host"], record["slot"])
        first = min(number for number, ranks in rounds.items() if where in ranks)
        planned = expected_env(rounds[first], *where)
        assert {n: env[n] for n in HOROVOD_PLACE_ENV} == {n: planned[n] for n in HOROVOD_PLACE_ENV}
        assert env[ENV_TORCH_RANK] is None, record  # torchrun's: from init() on
    # Every round: each member's variables and torch.distributed's view match the round.
    joined = [*(e for e in records(run, "init") if e["round"] == 1), *records(run, "reset")]
    seen: dict[int, set[tuple[str, int]]] = {}
    for record in joined:
        round_ranks = rounds[record["round"]]
        where = (record["host"], record["slot"])
        seen.setdefault(record["round"], set()).add(where)
        env = record["env"]
        expected = expected_env(round_ranks, *where)
        assert {name: env[name] for name in expected} == expected, record
        assert env[ENV_TORCH_RUN_ID] == record["job"], record
        rank, size = round_ranks[where], len(round_ranks)
        assert (record["rank"], record["size"]) == (rank, size), record
        assert record["dist_initialized"], record
        dist_view = (record["dist_rank"], record["dist_size"], record["dist_sum"])
        assert dist_view == (rank, size, size), record
        assert (record["local_size"], record["cross_rank"], record["cross_size"]) == (
            int(expected[ENV_HOROVOD_LOCAL_SIZE]),
            int(expected[ENV_HOROVOD_CROSS_RANK]),
            int(expected[ENV_HOROVOD_CROSS_SIZE]),
        ), record
    assert {r: sorted(s) for r, s in seen.items()} == {r: sorted(m) for r, m in rounds.items()}
    # Every member of a round names the same store as MASTER_ADDR:MASTER_PORT.
    for number in rounds:
        masters = {
            (e["env"][ENV_TORCH_MASTER_ADDR], e["env"][ENV_TORCH_MASTER_PORT])
            for e in joined
            if e["round"] == number
        }
        assert len(masters) == 1, (number, masters)


def check_newcomers(run: JobRun, host: str, round_ranks: dict[tuple[str, int], int]) -> None:
    """A newcomer's init() returns its place in the round the driver plans with it, which is
    the round it then trains in (tentative values, see docs/worker-runtime.md)."""
    number = min(e["round"] for e in records(run, "reset") if e["host"] == host)
    newcomers = [e for e in records(run, "init") if e["host"] == host]
    assert len(newcomers) == 2, run.explain()
    for record in newcomers:
        where = (record["host"], record["slot"])
        expected = expected_env(round_ranks, *where)
        del expected[ENV_TORCH_MASTER_ADDR]  # unknown until the join
        assert {name: record["env"][name] for name in expected} == expected, record
        assert record["env"][ENV_TORCH_MASTER_ADDR] is None, record
        place = (record["round"], record["rank"], record["size"])
        assert place == (number, round_ranks[where], len(round_ranks)), record
        assert (record["local_size"], record["cross_rank"], record["cross_size"]) == (
            int(expected[ENV_HOROVOD_LOCAL_SIZE]),
            int(expected[ENV_HOROVOD_CROSS_RANK]),
            int(expected[ENV_HOROVOD_CROSS_SIZE]),
        ), record
        # Until its join, torch.distributed is a provisional world of one.
        assert (record["dist_rank"], record["dist_size"], record["dist_sum"]) == (0, 1, 1)


def worker_args(*extra: str) -> list[str]:
    return ["--record-env", "--epochs", "3", "--samples", "48", "--step-time", "0.02", *extra]


def test_script_variables_and_default_group_follow_every_round(tmp_path: Path) -> None:
    """Two slots; a host of two slots added; that host blacklisted after a SIGKILL."""
    run = run_job(
        tmp_path,
        launcher_args=["-np", "2", "--min-np", "2", "--max-np", "8"],
        worker_args=worker_args("--expect-sizes", "2,4,2", "--fail", "2:1:3:sigkill"),
        schedule={0: f"{OLD}:2", 1: f"{OLD}:2,{NEW}:2"},
        timeout_s=90,
    )
    assert run.returncode == 0, run.explain()
    check_rounds(run, ROUNDS)
    check_newcomers(run, NEW, ROUNDS[2])


def test_replacements_read_their_planned_place_and_the_new_rounds_variables(
    tmp_path: Path,
) -> None:
    """Four slots on two hosts of three; a SIGKILL blacklists one, the spare host replaces it."""
    spare = "127.0.1.3"
    rounds = {
        1: {(OLD, 0): 0, (OLD, 1): 1, (NEW, 0): 2, (NEW, 1): 3},
        2: {(OLD, 0): 0, (OLD, 1): 1, (spare, 0): 2, (spare, 1): 3},
    }
    run = run_job(
        tmp_path,
        launcher_args=["-np", "4", "--min-np", "2", "--max-np", "4"],
        worker_args=worker_args("--expect-sizes", "4,4,4", "--fail", "1:1:3:sigkill"),
        schedule={0: f"{OLD}:2,{NEW}:2,{spare}:2"},
        timeout_s=90,
    )
    assert run.returncode == 0, run.explain()
    check_rounds(run, rounds)
    check_newcomers(run, spare, rounds[2])
