"""The Gloo groups whose waits end with the round (``rounds/abortable_gloo.py``): real Gloo
groups in one process, one thread a rank."""

from __future__ import annotations

import datetime
import importlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from elasticjob.worker_contract import ENV_TIMELINE_DIR
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.abortable_gloo import (
    BACKEND,
    RoundBoundGloo,
    mesh_backends,
)
from elasticjob.worker_runtime.rounds.process_group import RoundGroup

TIMEOUT = datetime.timedelta(seconds=60)
"""Gloo's own bound: far beyond what any wait here may take."""
DEADLINE_S = 20.0
CPU = torch.device("cpu")


def groups(round_groups: list[RoundGroup]) -> list[RoundBoundGloo]:
    """The members of one group, each in the round of its ``round_groups``' entry, formed
    together (Gloo connects them on threads)."""
    size = len(round_groups)
    store = dist.HashStore()
    made: dict[int, RoundBoundGloo] = {}

    def make(rank: int) -> None:
        options = SimpleNamespace(
            store=store, group_rank=rank, group_size=size, timeout=TIMEOUT, group_id=f"g{size}"
        )
        made[rank] = RoundBoundGloo(options, round_groups[rank])

    on_threads(size, make)
    return [made[rank] for rank in range(size)]


def on_threads(size: int, run: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "a rank did not finish"


def test_collectives_run_on_gloo_and_give_the_same_results() -> None:
    members = groups([RoundGroup("gloo", CPU), RoundGroup("gloo", CPU)])
    results: dict[int, list[torch.Tensor]] = {}

    def collectives(rank: int) -> None:
        group = members[rank]
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total, group=group)
        gathered = torch.zeros(4)
        dist.all_gather_single(gathered, torch.tensor([rank, rank + 0.5]), group=group)
        # Gloo's reduce-scatter works have no future: the wait runs on a thread of its own.
        scattered = torch.zeros(1)
        dist.reduce_scatter_single(scattered, torch.tensor([1.0, 2.0]) * (rank + 1), group=group)
        results[rank] = [total, gathered, scattered]

    on_threads(2, collectives)
    for rank in (0, 1):
        total, gathered, scattered = results[rank]
        assert total.tolist() == [3.0]
        assert gathered.tolist() == [0.0, 0.5, 1.0, 1.5]
        assert scattered.tolist() == [3.0 * (rank + 1)]


def test_a_wait_for_a_member_that_never_comes_ends_when_the_round_is_aborted() -> None:
    round_group = RoundGroup("gloo", CPU)
    members = groups([round_group, RoundGroup("gloo", CPU)])
    raised: list[BaseException] = []
    waiting = threading.Event()

    def wait_alone() -> None:
        work = members[0].allreduce([torch.ones(1)])
        waiting.set()
        try:
            work.wait()
        except HorovodInternalError as exc:
            raised.append(exc)

    thread = threading.Thread(target=wait_alone)
    thread.start()
    assert waiting.wait(DEADLINE_S)
    round_group.abort("worker 127.0.1.2[1] sent no heartbeat")
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the wait outlived the round"
    assert [str(exc) for exc in raised] == ["worker 127.0.1.2[1] sent no heartbeat"]
    # A collective issued after the abort is refused before it starts.
    with pytest.raises(HorovodInternalError, match="sent no heartbeat"):
        members[0].allreduce([torch.ones(1)])
    # Rank 1 comes after all: Gloo ends the collective rank 0 gave up on.
    dist.all_reduce(torch.ones(1), group=members[1])


def test_the_timeline_names_each_collective_after_its_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TIMELINE_DIR, str(tmp_path))
    recording = importlib.reload(timeline)
    try:
        members = groups([RoundGroup("gloo", CPU), RoundGroup("gloo", CPU)])
        on_threads(2, lambda rank: dist.all_reduce(torch.ones(1), group=members[rank]))
        recording.flush()
        lines = [line for part in tmp_path.iterdir() for line in part.read_text().splitlines()]
        spans = [json.loads(line) for line in lines]
    finally:
        monkeypatch.delenv(ENV_TIMELINE_DIR)
        importlib.reload(timeline)
    assert [(s["name"], s["cat"]) for s in spans] == [("allreduce", "collective")] * 2


@pytest.mark.parametrize(("backend", "override"), [("gloo", BACKEND), ("nccl", None)])
def test_a_mesh_of_a_gloo_round_uses_the_backend_and_one_of_nccl_its_own(
    backend: str, override: str | None
) -> None:
    round_group = RoundGroup(backend, CPU)
    assert mesh_backends(round_group, 2) == ((override, None), (override, None))
