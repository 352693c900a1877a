"""What the operator observes of a training job, as the status tests build it."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.operator.status_observation import Observation, PodCounts

T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(seconds=30)


def obs(**changes: Any) -> Observation:
    """A job training 3 of 3 desired pods (minReplicas 2) in round 4."""
    base = Observation(
        driver_phase=DriverPhase.RUNNING,
        result=None,
        recovering=False,
        desired=3,
        min_replicas=2,
        pods=PodCounts(live=3),
        round=4,
        world_size=3,
        training_pods=3,
        notice_seq=9,
    )
    return dataclasses.replace(base, **changes)
