"""This worker's side of the rendezvous round protocol: the one joiner of every process that
speaks it (the worker runtime, ``runtime_rounds.py``; the restart mode's agent; the health
check, for its cohort's store).

A :class:`Joiner` builds the request for a round (:class:`RendezvousRequest`: the worker, the
store it serves and the listener its peers probe, the round it leaves and how it left it) and
asks until the service assigns one (:class:`Assignment`) or says this worker is out of the job
(:class:`WorkerRemoved`).

A round's store is its rank 0's: every worker serves one on its bind address
(:func:`serve_store`) and names its port when it asks for a round; the member that becomes
rank 0 uses its own, the others connect to it, giving up as soon as the round failed
(:func:`round_store`). A health check's cohort forms its store the same way.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed import Store, TCPStore

from elasticjob.wire.messages import (
    HeldShards,
    PeerEndpoint,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ScriptExit,
    SlotInfo,
)
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.exceptions import WorkerRemoved
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.rounds.group_formation import connect_store

Endpoint = tuple[str, int]
"""Where a store is served: an address and a port."""


def serve_store(address: str, timeout: datetime.timedelta) -> TCPStore:
    """A store served on ``address``, on a free port, that waits for no client."""
    return TCPStore(address, 0, is_master=True, wait_for_workers=False, timeout=timeout)


def round_store(
    served: Store,
    rank: int,
    master: Endpoint,
    timeout: datetime.timedelta,
    failed: Callable[[], bool] = lambda: False,
) -> Store:
    """The store of a round (or of a health check's cohort) for its member of ``rank``: the
    store it serves itself (``served``) when it is rank 0, else a client of rank 0's at
    ``master``, connected within ``timeout``. Raises :class:`HorovodInternalError` once
    ``failed()`` (the round failed) or at the timeout."""
    if rank == 0:
        return served
    return connect_store(*master, timeout, failed)


@dataclass(frozen=True)
class Assignment:
    """The round the service assigned this worker."""

    round: int
    slot: SlotInfo
    master: Endpoint
    """Where the round's rank 0 serves the round's store."""
    notice_seq: int
    """The job's notices up to this one are accounted for by the round."""
    sync: bool
    """Whether state must be synced from rank 0 on entering it."""
    peers: tuple[PeerEndpoint, ...]
    """The members this worker probes when one of its collectives blocks."""

    @classmethod
    def of(cls, response: RendezvousResponse) -> Assignment:
        """The assignment an ``ASSIGNED`` answer carries."""
        if response.slot is None or response.store_address is None or response.store_port is None:
            raise ValueError(f"round {response.round} was assigned without a slot or a store")
        return cls(
            round=response.round,
            slot=response.slot,
            master=(response.store_address, response.store_port),
            notice_seq=response.notice_seq,
            sync=response.sync,
            peers=response.peers,
        )


class Joiner:
    """Asks for rounds for the worker ``config`` describes, through ``client``;
    ``probe_port``: the listener its peers probe (None: it is probed by nobody)."""

    def __init__(
        self, config: WorkerConfig, client: RendezvousClient, probe_port: int | None = None
    ) -> None:
        self._config = config
        self._client = client
        self._probe_port = probe_port

    def join(
        self,
        after_round: int,
        store_port: int,
        *,
        deadline: float,
        rolled_back: bool = False,
        script_exit: ScriptExit | None = None,
        suspended: bool = False,
        held_shards: HeldShards | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Assignment | None:
        """The round after ``after_round`` (None once ``stopped()``), for a worker serving its
        store on ``store_port``, that left ``after_round`` as the request says
        (``RendezvousRequest``: ``rolled_back``, ``script_exit``, ``suspended``), holding
        ``held_shards`` of a one-dimensional sharded state. Raises
        :class:`WorkerRemoved` when the worker is no longer part of the job or the job
        ended, and RuntimeError when ``deadline`` (``time.monotonic()``) passes first."""
        config = self._config
        request = RendezvousRequest(
            hostname=config.hostname,
            local_rank=config.local_rank,
            address=config.bind_address,
            store_port=store_port,
            probe_port=self._probe_port,
            after_round=after_round,
            rolled_back=rolled_back,
            script_exit=script_exit,
            suspended=suspended,
            held_shards=held_shards,
        )
        response = self._client.await_round(request, deadline=deadline, stopped=stopped)
        if response is None:
            return None
        if response.status is not RendezvousStatus.ASSIGNED:
            raise WorkerRemoved(
                f"worker {config.hostname}[{config.local_rank}] leaves the job: "
                f"{response.message or response.status.value.lower()}"
            )
        return Assignment.of(response)

    def deadline(self) -> float:
        """The deadline of a join that starts now (``time.monotonic()``): the contract's
        longest wait for a round."""
        return time.monotonic() + self._config.round_wait_s
