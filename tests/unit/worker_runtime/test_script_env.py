"""The script variables computed from a slot, a round and a running job's round info."""

from __future__ import annotations

import pytest

from elasticjob.script_env import (
    ENV_TORCH_MASTER_ADDR,
    ENV_TORCH_MASTER_PORT,
    SCRIPT_ROUND_ENV,
    launch_env,
    restart_env,
    round_env,
    tentative_slot,
)
from elasticjob.wire.messages import RoundInfo, SlotInfo
from elasticjob.worker_contract import SCRIPT_LAUNCH_ENV


def slot(rank: int, size: int, local: tuple[int, int], cross: tuple[int, int]) -> SlotInfo:
    return SlotInfo(
        hostname="h2",
        rank=rank,
        size=size,
        local_rank=local[0],
        local_size=local[1],
        cross_rank=cross[0],
        cross_size=cross[1],
    )


def test_launch_env_names_the_host_and_slot() -> None:
    assert launch_env("pod-x", 3) == {
        "HOROVOD_HOSTNAME": "pod-x",
        "HOROVOD_LOCAL_RANK": "3",
        "LOCAL_RANK": "3",
    }


@pytest.mark.parametrize(
    ("place", "expected"),
    [
        (
            slot(0, 1, (0, 1), (0, 1)),
            ("0", "1", "0", "1", "0", "1"),
        ),
        (
            slot(5, 8, (1, 4), (1, 2)),
            ("5", "8", "1", "4", "1", "2"),
        ),
        (
            slot(6, 7, (2, 3), (0, 1)),  # uneven hosts: only h2 runs a third slot
            ("6", "7", "2", "3", "0", "1"),
        ),
    ],
)
def test_round_env_gives_horovods_and_torchruns_view_of_the_slot(
    place: SlotInfo, expected: tuple[str, ...]
) -> None:
    env = round_env(place, job="ns.job", master=("10.0.0.1", 29500))
    rank, size, local_rank, local_size, cross_rank, cross_size = expected
    assert env == {
        "HOROVOD_HOSTNAME": "h2",
        "HOROVOD_RANK": rank,
        "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": local_rank,
        "HOROVOD_LOCAL_SIZE": local_size,
        "HOROVOD_CROSS_RANK": cross_rank,
        "HOROVOD_CROSS_SIZE": cross_size,
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_size,
        "GROUP_RANK": cross_rank,
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "ns.job",
    }
    assert env.keys() == SCRIPT_LAUNCH_ENV | SCRIPT_ROUND_ENV


def test_round_env_without_a_master_leaves_master_addr_and_port_out() -> None:
    env = round_env(slot(0, 1, (0, 1), (0, 1)), job="j", master=None)
    assert ENV_TORCH_MASTER_ADDR not in env and ENV_TORCH_MASTER_PORT not in env


def info(size: int, hosts: tuple[str, ...]) -> RoundInfo:
    return RoundInfo(job="j", round=4, size=size, hosts=hosts, latest_notice_seq=0)


@pytest.mark.parametrize(
    ("current", "host", "local_rank", "expected"),
    [
        # Two hosts of two slots: a new host's slots go after them.
        (info(4, ("h0", "h1")), "h2", 0, (4, 5, 0, 1, 2, 3)),
        (info(4, ("h0", "h1")), "h2", 1, (5, 6, 1, 2, 2, 3)),
        # One host of one slot: the newcomer's host is the second.
        (info(1, ("h0",)), "h2", 0, (1, 2, 0, 1, 1, 2)),
    ],
)
def test_tentative_slot_places_a_newcomer_after_the_current_members(
    current: RoundInfo, host: str, local_rank: int, expected: tuple[int, ...]
) -> None:
    got = tentative_slot(current, host, local_rank)
    assert got.hostname == host
    assert (
        got.rank,
        got.size,
        got.local_rank,
        got.local_size,
        got.cross_rank,
        got.cross_size,
    ) == expected


TORCHRUN_CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
"""torchrun's worker variables (torch 2.13's ``LocalElasticAgent._start_workers``), in its
order; ``OMP_NUM_THREADS`` has rows of its own."""


@pytest.mark.parametrize(
    ("place", "restarts", "expected"),
    [
        pytest.param(
            slot(0, 1, (0, 1), (0, 1)),
            0,
            ("0", "0", "0", "0", "1", "1", "1", "1", "default", "10.0.0.1", "29500", "0", "3"),
            id="world-of-one",
        ),
        pytest.param(
            slot(5, 8, (1, 4), (1, 2)),
            2,
            ("5", "1", "1", "5", "4", "8", "2", "8", "default", "10.0.0.1", "29500", "2", "3"),
            id="second-host-of-two",
        ),
    ],
)
def test_restart_env_is_torchruns_worker_contract(
    place: SlotInfo, restarts: int, expected: tuple[str, ...]
) -> None:
    env = restart_env(
        place,
        job="ns.job",
        master=("10.0.0.1", 29500),
        restart_count=restarts,
        max_restarts=3,
        error_file="/tmp/agent/error.json",
        inherited={},
    )
    assert tuple(env[name] for name in TORCHRUN_CONTRACT) == (
        *expected,
        "ns.job",
        "True",  # every rank is a client of the agent's store, as under torchrun
        "/tmp/agent/error.json",
        "1",
    )


@pytest.mark.parametrize(
    ("local_size", "inherited", "omp", "nccl"),
    [
        pytest.param(1, {}, None, "1", id="one-process-per-host-sets-no-threads"),
        pytest.param(4, {}, "1", "1", id="several-processes-get-one-thread-each"),
        pytest.param(4, {"OMP_NUM_THREADS": "8"}, "8", "1", id="the-users-threads-are-kept"),
        pytest.param(
            1, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, None, "3", id="the-users-nccl-mode"
        ),
    ],
)
def test_restart_env_applies_torchruns_defaults_unless_the_user_set_them(
    local_size: int, inherited: dict[str, str], omp: str | None, nccl: str
) -> None:
    env = restart_env(
        slot(0, local_size, (0, local_size), (0, 1)),
        job="j",
        master=("h", 1),
        restart_count=0,
        max_restarts=0,
        error_file="e.json",
        inherited=inherited,
    )
    assert (env.get("OMP_NUM_THREADS"), env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == (omp, nccl)
