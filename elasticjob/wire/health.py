"""The health check's messages: what a new worker pod and the rendezvous service
exchange before the pod may join a round (``spec.healthCheck``).

A pod's check (``elasticjob.worker_runtime.agents.health_check``) first asks for a cohort
(:class:`CohortRequest`, a long-poll): the pods starting at about the same time are gathered
into one, and each is told its rank in it and the store of its rank 0
(:class:`CohortResponse`). The cohort runs one collective, each pod measures its compute and
its copy bandwidth, and each sends its figures (:class:`HealthReport`, a long-poll too). The
service judges the whole cohort at once against its peers (``elasticjob.rendezvous.health_rule``)
and answers each pod its :class:`HealthVerdict`.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

from pydantic import Field, StringConstraints, model_validator

from elasticjob.wire.messages import HostName, Port
from elasticjob.wire.strict_json import StrictModel

MAX_COMPUTE_GFLOPS: Final = 1e7
"""Largest compute figure a pod may report: 10 PFLOP/s, ten times today's fastest single
accelerator in its densest format."""
MAX_COPY_GBPS: Final = 1e5
"""Largest copy bandwidth a pod may report: 100 TB/s, twenty times today's fastest memory."""
_Seconds = Annotated[float, Field(strict=True, ge=0, le=86400, allow_inf_nan=False)]
_Wait = Annotated[float, Field(strict=True, ge=0, le=60, allow_inf_nan=False)]
CohortNumber = Annotated[int, Field(strict=True, ge=1)]


class CohortRequest(StrictModel):
    """A pod asks for the cohort it runs its check with, giving the store endpoint it serves
    (used if it becomes the cohort's rank 0); waits up to ``wait_seconds`` for the cohort to
    close."""

    hostname: HostName
    address: HostName
    store_port: Port
    wait_seconds: _Wait = 0.0


class CohortResponse(StrictModel):
    """The pod's cohort (``cohort`` 0 while it is still being gathered: ask again)."""

    cohort: Annotated[int, Field(strict=True, ge=0)] = 0
    rank: Annotated[int, Field(strict=True, ge=0)] = 0
    size: Annotated[int, Field(strict=True, ge=0)] = 0
    store_address: HostName | None = None
    store_port: Port | None = None
    store_prefix: Annotated[str, StringConstraints(max_length=512)] = ""
    """The keys of the cohort's group on that store: fresh for every cohort."""
    deadline_seconds: _Seconds = 0.0
    """Seconds from now within which the pod must report (the cohort is judged then, with
    or without it)."""


class HealthProblem(enum.StrEnum):
    """What went wrong in a pod's check."""

    COLLECTIVE = "Collective"
    """The cohort's collective failed, timed out or gave a wrong sum: a member, or a link
    between members, is broken; which one is not known from the collective alone."""
    BENCHMARK = "Benchmark"
    """A micro-benchmark raised, or computed a wrong result: this pod's device is broken."""


class HealthFigures(StrictModel):
    """What a pod measured: its compute (a matrix multiply) and copy bandwidth on its
    ``device`` kind, each capped (:data:`MAX_COMPUTE_GFLOPS`, :data:`MAX_COPY_GBPS`), and how
    long its cohort's collective took (None: a cohort of one runs none)."""

    device: Annotated[str, StringConstraints(pattern=r"^(cpu|cuda)$")]
    compute_gflops: Annotated[
        float, Field(strict=True, gt=0, le=MAX_COMPUTE_GFLOPS, allow_inf_nan=False)
    ]
    copy_gbps: Annotated[float, Field(strict=True, gt=0, le=MAX_COPY_GBPS, allow_inf_nan=False)]
    collective_s: _Seconds | None = None


class HealthReport(StrictModel):
    """A pod's result in ``cohort``: its figures, or the problem that stopped its check
    (with a message). ``seconds``: how long its check took, the cohort's gathering
    included. Waits up to ``wait_seconds`` for the verdict."""

    hostname: HostName
    cohort: CohortNumber
    seconds: _Seconds
    figures: HealthFigures | None = None
    problem: HealthProblem | None = None
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    wait_seconds: _Wait = 0.0

    @model_validator(mode="after")
    def _figures_or_a_problem(self) -> HealthReport:
        if (self.figures is None) == (self.problem is None):
            raise ValueError("a report carries either figures or a problem")
        return self


class VerdictStatus(enum.StrEnum):
    PENDING = "Pending"
    """The cohort is not judged yet: ask again."""
    PASSED = "Passed"
    """The pod may join the job."""
    FAILED = "Failed"
    """The pod is not admitted; its node is blacklisted and the pod deleted."""
    RETRY = "Retry"
    """The check was inconclusive through no fault of this pod (another member of its
    cohort broke the collective): ask for a new cohort."""


class HealthVerdict(StrictModel):
    status: VerdictStatus
    reason: str = ""
    """Why (for a failure: what fell short, and by how much)."""
