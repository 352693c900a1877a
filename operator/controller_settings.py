"""How the operator runs each job's controller (the same for every job)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticjob.operator.api.podschema import PodSchema


@dataclass(frozen=True)
class ControllerSettings:
    """What every job's controller is told."""

    rendezvous_url: str
    """The URL worker pods reach the rendezvous service at."""
    rendezvous_ca: str | None = None
    """The CA certificate (PEM) workers verify an ``https`` rendezvous URL with."""
    removal_deadline_s: float = 60.0
    """How long a pod chosen for scale-in may take to exit before it is deleted anyway."""
    reconcile_interval_s: float = 1.0
    """The controller runs a pass at least this often, even when nothing wakes it."""
    pod_schema: PodSchema | None = None
    """The API server's Pod schema: a pod template field a pod does not have is invalid."""
    operator_namespace: str | None = None
    """The operator's own namespace, where it runs no job (None: not known)."""
    worker_network_policy: bool = True
    """Give each job a NetworkPolicy that admits only its own pods to its workers
    (``pod_guards.py``)."""
