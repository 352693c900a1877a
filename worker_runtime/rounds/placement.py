"""A worker's place as the script sees it: the tentative one of a worker added to a running
job (before it joins), and the script variables (``elasticjob.script_env``) in ``os.environ``.
"""

from __future__ import annotations

import os

from elasticjob.script_env import SCRIPT_ROUND_ENV, round_env, tentative_slot
from elasticjob.wire.messages import RoundInfo, SlotInfo
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError

logger = get_logger(__name__)

PLAN_RETRY_S = 5.0
"""How long ``init()`` retries asking for the planned round (the plan is only a hint)."""


def tentative_place(
    client: RendezvousClient, config: WorkerConfig, current: RoundInfo
) -> tuple[int, SlotInfo]:
    """The round and slot a worker added to a running job is planned into, until it joins:
    the driver's plan (``GET plan``), or an estimate from the ``current`` round when the plan
    does not name this worker (see :func:`~elasticjob.script_env.tentative_slot`)."""
    me = (config.hostname, config.local_rank)
    try:
        plan = client.planned_round(retry_for_s=PLAN_RETRY_S)
    except RendezvousClientError as exc:
        logger.info("no planned round from the rendezvous service (%s)", exc)
    else:
        for slot in plan.slots if plan.round > current.round else ():
            if (slot.hostname, slot.local_rank) == me:
                return plan.round, slot
    return current.round + 1, tentative_slot(current, *me)


def export_script_env(slot: SlotInfo, job: str, master: tuple[str, int] | None) -> None:
    """Write the script variables (horovodrun's and torchrun's) of ``slot`` into
    ``os.environ``, for the script and the libraries that read them; ``master``: the round's
    store (None while tentative: ``MASTER_ADDR`` and ``MASTER_PORT`` are removed)."""
    env = round_env(slot, job=job, master=master)
    for name in SCRIPT_ROUND_ENV - env.keys():
        os.environ.pop(name, None)
    os.environ.update(env)
