"""A newcomer's tentative place at init(): the driver's plan, else an estimate; and the script
variables written into ``os.environ``."""

from __future__ import annotations

import os

import pytest

from elasticjob.script_env import (
    ENV_HOROVOD_RANK,
    ENV_TORCH_MASTER_ADDR,
    ENV_TORCH_MASTER_PORT,
    ENV_TORCH_RANK,
)
from elasticjob.wire.messages import PlannedRound, RoundInfo, SlotInfo
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from elasticjob.worker_runtime.rounds.placement import export_script_env, tentative_place

CONFIG = WorkerConfig(
    rendezvous_url="http://127.0.0.1:1",
    job="job",
    token="t",
    hostname="new",
    local_rank=1,
    bind_address="127.0.0.1",
)
CURRENT = RoundInfo(job="job", round=3, size=2, hosts=("old",), latest_notice_seq=0)


def slot(hostname: str, local_rank: int, rank: int) -> SlotInfo:
    return SlotInfo(
        hostname=hostname,
        rank=rank,
        local_rank=local_rank,
        cross_rank=0 if hostname == "old" else 1,
        size=4,
        local_size=2,
        cross_size=2,
    )


PLAN = PlannedRound(
    round=4, slots=(slot("old", 0, 0), slot("old", 1, 1), slot("new", 0, 2), slot("new", 1, 3))
)


class FakeClient(RendezvousClient):
    def __init__(self, answer: PlannedRound | None) -> None:
        super().__init__("http://127.0.0.1:1", "job", "t")
        self.answer = answer

    def planned_round(self, *, retry_for_s: float) -> PlannedRound:
        if self.answer is None:
            raise RendezvousClientError("rendezvous GET /plan refused with 404: not found")
        return self.answer


def test_the_plan_that_names_the_worker_gives_its_place() -> None:
    assert tentative_place(FakeClient(PLAN), CONFIG, CURRENT) == (4, PLAN.slots[3])


@pytest.mark.parametrize(
    "answer",
    [
        None,  # a service without the endpoint
        PlannedRound(),  # nothing planned
        PlannedRound(round=3, slots=PLAN.slots),  # a plan of the current round: stale
        PlannedRound(round=4, slots=PLAN.slots[:3]),  # a plan without this worker
    ],
)
def test_without_a_plan_naming_the_worker_it_estimates(answer: PlannedRound | None) -> None:
    number, place = tentative_place(FakeClient(answer), CONFIG, CURRENT)
    assert number == 4
    assert (place.rank, place.size, place.local_rank, place.cross_rank) == (3, 4, 1, 1)


def test_export_sets_the_round_and_removes_a_stale_master(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {ENV_TORCH_MASTER_ADDR: "stale", ENV_TORCH_MASTER_PORT: "1"}
    monkeypatch.setattr(os, "environ", environ)  # the test process's own stays untouched
    export_script_env(PLAN.slots[2], "job", None)
    assert environ[ENV_HOROVOD_RANK] == environ[ENV_TORCH_RANK] == "2"
    assert ENV_TORCH_MASTER_ADDR not in environ
    assert ENV_TORCH_MASTER_PORT not in environ
    export_script_env(PLAN.slots[2], "job", ("10.0.0.1", 29400))
    assert (environ[ENV_TORCH_MASTER_ADDR], environ[ENV_TORCH_MASTER_PORT]) == (
        "10.0.0.1",
        "29400",
    )
