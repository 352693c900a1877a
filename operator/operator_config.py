"""The operator process's configuration, as ``elasticjob-operator``'s options and environment
give it: the rendezvous service's address and transport, the admission webhook, the namespaces
watched, the operator's own pod, the Service that routes workers to it and the leader
election."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from elasticjob.operator.certs import ManagedCertificate, TLSMaterial
from elasticjob.operator.leader_election import ElectionSettings
from elasticjob.operator.leader_lease import LeaseRef
from elasticjob.operator.service_route import ServiceRoute


@dataclass(frozen=True)
class OperatorConfig:
    """What ``elasticjob-operator``'s options and environment tell the operator process."""

    rendezvous_url: str
    """How worker pods reach this process's rendezvous service."""
    bind_address: str = "0.0.0.0"
    rendezvous_port: int = 8470
    metrics_port: int = 8471
    webhook: WebhookConfig | None = None
    """Serve the validating admission webhook (kopf manages its configuration object)."""
    namespaces: tuple[str, ...] = ()
    """The namespaces whose jobs the operator runs (empty: every namespace)."""
    rendezvous_tls: TLSMaterial | ManagedCertificate | None = None
    """Serve the rendezvous service over TLS with this material (read from a mounted Secret)
    or with one the operator makes and keeps (None: plain HTTP)."""
    tls_dir: Path = Path(tempfile.gettempdir()) / "elasticjob-rendezvous"
    """Where the rendezvous service's key is written for :mod:`ssl` to load it."""
    own_pod: tuple[str, str] | None = None
    """The operator's own pod (namespace, name), which it follows (see ``ownpod.py``; None:
    it runs outside a pod, or is not told its name)."""
    service_route: ServiceRoute | None = None
    """The rendezvous Service whose EndpointSlice this replica writes while it leads, and its pod's
    address (None: it runs outside a pod, or is not told them; nothing is routed)."""
    leader_election: LeaderElectionConfig | None = None
    """Lead only while holding this Lease (None: lead from the start, alone)."""
    worker_network_policy: bool = True
    """Give each job a NetworkPolicy admitting only its own pods to its workers."""


@dataclass(frozen=True)
class LeaderElectionConfig:
    """The Lease the replicas elect their leader with, and the election's timing."""

    lease: LeaseRef
    settings: ElectionSettings = field(default_factory=ElectionSettings)


@dataclass(frozen=True)
class WebhookConfig:
    """The validating admission webhook the operator serves."""

    service: str
    """The Service the API server sends admission reviews to (every replica behind it)."""
    namespace: str
    port: int = 8443
    cert_dir: Path = Path(tempfile.gettempdir()) / "elasticjob-webhook"
    owner: str | None = None
    """A ClusterRole that owns the webhook configurations, so that they are garbage-collected
    with it when the operator is uninstalled (None: they are left behind)."""
    configuration: str | None = None
    """The name of the webhook configurations (None: ``<service>.<namespace>.svc``)."""
    tls_secret: str | None = None
    """Keep the webhook's certificate in this Secret of ``namespace``, so that every replica
    serves the one its configuration names (None: each start makes its own)."""

    @property
    def configuration_name(self) -> str:
        """The name of the webhook configurations; kopf names their webhooks after it (a
        domain of three or more labels)."""
        return self.configuration or f"{self.service}.{self.namespace}.svc"
