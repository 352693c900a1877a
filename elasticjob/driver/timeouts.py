"""Whom the driver stops for taking too long, as pure functions of the worker records and
``now``: a newcomer that does not register (:func:`slow_starters`), a dismissed worker that
does not exit (:func:`overdue_dismissals`), and a process that reported how it ends but does
not end (:func:`overdue_endings`). ``driver.py`` stops them."""

from __future__ import annotations

import math
from collections.abc import Mapping

from elasticjob.driver.driver_types import Departure
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import WorkerId


def slow_starters(
    workers: Mapping[WorkerId, WorkerRecord], *, now: float, start_timeout_s: float
) -> tuple[WorkerId, ...]:
    """Newcomers that have not registered within ``start_timeout_s`` of their start: they
    count as failed."""
    return tuple(
        w
        for w, record in workers.items()
        if record.running
        and record.departure is None
        and record.last_round == 0
        and record.waiting_after is None
        and now - record.started_at > start_timeout_s
    )


def overdue_dismissals(
    workers: Mapping[WorkerId, WorkerRecord], *, now: float, grace_s: float
) -> tuple[WorkerId, ...]:
    """Dismissed workers still running ``grace_s`` after their dismissal: to be stopped."""
    return tuple(
        w
        for w, record in workers.items()
        if record.running
        and record.departure is Departure.DISMISSED
        and not record.stop_requested
        and record.dismissed_at is not None
        and now - record.dismissed_at >= grace_s
    )


def overdue_endings(
    workers: Mapping[WorkerId, WorkerRecord],
    *,
    now: float,
    grace_s: float,
    heartbeat_timeout_s: float | None,
    counts_from: float | None = -math.inf,
) -> tuple[WorkerId, ...]:
    """Workers that reported how their process ends (their script returned or raised) and
    still run ``grace_s`` after both that report and their last heartbeat: their teardown
    hangs (a communicator that never shuts down, a native destructor), to be stopped.

    A worker beats until its interpreter exits, so work after the training loop (an
    evaluation, a save) is never cut short; at exit it stops beating. Once it reported, its
    silence no longer kills it (teardown may outlast the heartbeat timeout), so without
    this nothing would end it, and the round waits for every member's end. As with
    kills (``liveness.hung_workers``), nobody is judged without a heartbeat timeout
    (``heartbeat_timeout_s`` None: workers beat rarely or not at all) or while the workers
    cannot reach the driver (``counts_from`` None), and silence counts no earlier than
    ``counts_from``. A process that reported success ends as it said (see
    ``decisions.classify_exit``)."""
    if heartbeat_timeout_s is None or counts_from is None:
        return ()
    return tuple(
        w
        for w, record in workers.items()
        if record.running
        and record.departure is None
        and not record.stop_requested
        and record.ending_since is not None
        and record.last_heartbeat is not None
        and now - max(record.ending_since, record.last_heartbeat, counts_from) >= grace_s
    )


def past_active_deadline(running_s: float, deadline_s: float | None) -> str | None:
    """Why a job that has run ``running_s`` (its time suspended left out) fails for its
    active deadline ``deadline_s`` (None: it does not; ``deadline_s`` None: no deadline)."""
    if deadline_s is None or running_s < deadline_s:
        return None
    return (
        f"the job was active for {running_s:.0f} s, past its active deadline of "
        f"{deadline_s:.0f} s: its workers were stopped"
    )
