"""The environment that training scripts and their libraries read: horovodrun's and torchrun's.

Two pure functions compute it; nothing here touches ``os.environ``:

- :func:`~elasticjob.worker_contract.launch_env`: what is known when a worker process starts,
  its host and slot (``HOROVOD_HOSTNAME``, ``HOROVOD_LOCAL_RANK``, ``LOCAL_RANK``). It is part
  of the worker contract, which the launcher, the operator and the slots runner write.
- :func:`round_env`: the worker's place in one round (Horovod's rank, size, local and cross
  values; torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, the round's
  rendezvous store as ``MASTER_ADDR``/``MASTER_PORT`` and the job as ``TORCHELASTIC_RUN_ID``).
  The worker runtime writes it into ``os.environ`` each time the worker joins a round.

- :func:`restart_env`: what a restart-mode script gets at each start
  (``elasticjob.worker_runtime.agents.restart_agent``): :func:`round_env` and the rest of torchrun's
  worker contract (the role, the restart count and limit, the agent's store, the thread and
  NCCL defaults torchrun applies).

``GROUP_RANK`` is torchrun's node rank; here it is the worker's cross rank, which is the index
of its host in the round whenever the round's hosts run the same number of processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from elasticjob.wire.messages import RoundInfo, SlotInfo
from elasticjob.worker_contract import launch_env

ENV_HOROVOD_RANK: Final = "HOROVOD_RANK"
ENV_HOROVOD_SIZE: Final = "HOROVOD_SIZE"
ENV_HOROVOD_LOCAL_SIZE: Final = "HOROVOD_LOCAL_SIZE"
ENV_HOROVOD_CROSS_RANK: Final = "HOROVOD_CROSS_RANK"
ENV_HOROVOD_CROSS_SIZE: Final = "HOROVOD_CROSS_SIZE"
ENV_TORCH_RANK: Final = "RANK"
ENV_TORCH_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_TORCH_LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
ENV_TORCH_GROUP_RANK: Final = "GROUP_RANK"
ENV_TORCH_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_TORCH_MASTER_PORT: Final = "MASTER_PORT"
ENV_TORCH_RUN_ID: Final = "TORCHELASTIC_RUN_ID"
ENV_TORCH_GROUP_WORLD_SIZE: Final = "GROUP_WORLD_SIZE"
ENV_TORCH_ROLE_RANK: Final = "ROLE_RANK"
ENV_TORCH_ROLE_WORLD_SIZE: Final = "ROLE_WORLD_SIZE"
ENV_TORCH_ROLE_NAME: Final = "ROLE_NAME"
ENV_TORCH_RESTART_COUNT: Final = "TORCHELASTIC_RESTART_COUNT"
ENV_TORCH_MAX_RESTARTS: Final = "TORCHELASTIC_MAX_RESTARTS"
ENV_TORCH_USE_AGENT_STORE: Final = "TORCHELASTIC_USE_AGENT_STORE"
ENV_TORCH_NCCL_ASYNC_ERROR_HANDLING: Final = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ENV_OMP_NUM_THREADS: Final = "OMP_NUM_THREADS"
ENV_TORCH_ERROR_FILE: Final = "TORCHELASTIC_ERROR_FILE"
TORCHRUN_ROLE: Final = "default"
"""torchrun's ``--role`` default: every worker has the one role."""
SCRIPT_ROUND_ENV: Final = frozenset(
    {
        ENV_HOROVOD_RANK,
        ENV_HOROVOD_SIZE,
        ENV_HOROVOD_LOCAL_SIZE,
        ENV_HOROVOD_CROSS_RANK,
        ENV_HOROVOD_CROSS_SIZE,
        ENV_TORCH_RANK,
        ENV_TORCH_WORLD_SIZE,
        ENV_TORCH_LOCAL_WORLD_SIZE,
        ENV_TORCH_GROUP_RANK,
        ENV_TORCH_MASTER_ADDR,
        ENV_TORCH_MASTER_PORT,
        ENV_TORCH_RUN_ID,
    }
)
"""Script variables of the round the worker is in: rewritten in ``os.environ`` each round."""


def round_env(slot: SlotInfo, *, job: str, master: tuple[str, int] | None) -> dict[str, str]:
    """Every script variable of a worker with ``slot`` in a round whose rank 0 hosts its
    store at ``master`` (address, port), the launch-time ones included (from the slot).
    ``master`` None (a tentative slot: the round's rank 0 is not known yet) leaves
    ``MASTER_ADDR`` and ``MASTER_PORT`` out."""
    env = {
        **launch_env(slot.hostname, slot.local_rank),
        ENV_HOROVOD_RANK: str(slot.rank),
        ENV_HOROVOD_SIZE: str(slot.size),
        ENV_HOROVOD_LOCAL_SIZE: str(slot.local_size),
        ENV_HOROVOD_CROSS_RANK: str(slot.cross_rank),
        ENV_HOROVOD_CROSS_SIZE: str(slot.cross_size),
        ENV_TORCH_RANK: str(slot.rank),
        ENV_TORCH_WORLD_SIZE: str(slot.size),
        ENV_TORCH_LOCAL_WORLD_SIZE: str(slot.local_size),
        ENV_TORCH_GROUP_RANK: str(slot.cross_rank),
        ENV_TORCH_RUN_ID: job,
    }
    if master is not None:
        env[ENV_TORCH_MASTER_ADDR] = master[0]
        env[ENV_TORCH_MASTER_PORT] = str(master[1])
    return env


HOROVOD_PLACE_ENV: Final = frozenset(
    {
        ENV_HOROVOD_RANK,
        ENV_HOROVOD_SIZE,
        ENV_HOROVOD_LOCAL_SIZE,
        ENV_HOROVOD_CROSS_RANK,
        ENV_HOROVOD_CROSS_SIZE,
    }
)
"""Horovod's variables of a worker's place in a round, beyond its host and slot."""


def planned_env(slot: SlotInfo) -> dict[str, str]:
    """What horovodrun tells a process it starts: Horovod's variables of the place it is
    planned into (``elasticjob-run`` writes them at start; the runtime rewrites them when the
    worker joins a round, which may place it otherwise). torchrun's are left to the runtime:
    a torchrun script reading ``RANK`` at start also needs ``MASTER_ADDR``, known only once
    the round forms."""
    env = round_env(slot, job="", master=None)
    return {name: env[name] for name in HOROVOD_PLACE_ENV}


def tentative_slot(current: RoundInfo, hostname: str, local_rank: int) -> SlotInfo:
    """The place a worker added to a running job tentatively has until it joins its first
    round: the place it would get if its host were the only one added and ran no process
    beyond its own slot. The driver orders hosts oldest first, so the rank is exact when one
    host joins (all of its slots do, or a prefix of them); the sizes are lower bounds (exact
    for the host's last slot)."""
    hosts = current.hosts
    return SlotInfo(
        hostname=hostname,
        rank=current.size + local_rank,
        local_rank=local_rank,
        cross_rank=len(hosts),
        size=current.size + local_rank + 1,
        local_size=local_rank + 1,
        cross_size=len(hosts) + 1,
    )


PER_START_ENV: Final = (SCRIPT_ROUND_ENV - {ENV_TORCH_RUN_ID}) | {
    ENV_TORCH_GROUP_WORLD_SIZE,
    ENV_TORCH_ROLE_RANK,
    ENV_TORCH_ROLE_WORLD_SIZE,
    ENV_TORCH_RESTART_COUNT,
}
"""The variables of :func:`restart_env` that may differ between two starts of one slot's
script: its place in the job (the round's variables but the job's id), the store, the
restart count. Nothing reads them when torch is imported (``init_process_group`` reads
them), so a start server started with one start's environment serves the next
(``worker_runtime/agents/start_server.py``)."""


def restart_env(
    slot: SlotInfo,
    *,
    job: str,
    master: tuple[str, int],
    restart_count: int,
    max_restarts: int,
    error_file: str,
    inherited: Mapping[str, str],
) -> dict[str, str]:
    """torchrun's worker contract for a restart-mode script in ``slot``, whose agent serves
    the attempt's store at ``master``: :func:`round_env`, and the role (one role, as under
    torchrun: its rank and size are the global ones), the agent's count of restarts after a
    failure and their limit, ``TORCHELASTIC_USE_AGENT_STORE`` (every rank is a client of the
    agent's store), the file where ``@record`` writes the script's uncaught exception
    (``TORCHELASTIC_ERROR_FILE``: ``error_file``), and the defaults torchrun applies when
    ``inherited`` (the agent's environment) does not set them:
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, and ``OMP_NUM_THREADS=1`` when the host runs more
    than one process."""
    env = {
        **round_env(slot, job=job, master=master),
        ENV_TORCH_GROUP_WORLD_SIZE: str(slot.cross_size),
        ENV_TORCH_ROLE_RANK: str(slot.rank),
        ENV_TORCH_ROLE_WORLD_SIZE: str(slot.size),
        ENV_TORCH_ROLE_NAME: TORCHRUN_ROLE,
        ENV_TORCH_RESTART_COUNT: str(restart_count),
        ENV_TORCH_MAX_RESTARTS: str(max_restarts),
        ENV_TORCH_USE_AGENT_STORE: "True",
        ENV_TORCH_ERROR_FILE: error_file,
        ENV_TORCH_NCCL_ASYNC_ERROR_HANDLING: inherited.get(
            ENV_TORCH_NCCL_ASYNC_ERROR_HANDLING, "1"
        ),
    }
    if ENV_OMP_NUM_THREADS in inherited:
        env[ENV_OMP_NUM_THREADS] = inherited[ENV_OMP_NUM_THREADS]
    elif slot.local_size > 1:
        env[ENV_OMP_NUM_THREADS] = "1"
    return env
