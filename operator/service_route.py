"""Where the rendezvous Service sends the workers: the one owner of that route.

The chart's rendezvous Service has no selector; its EndpointSlice (named as the Service,
labelled with the Service's name) names the replica that leads, and only that replica writes
it. A leader writes its own pod's address there (:meth:`ServiceRoute.routed`; it makes the
slice if there is none, :meth:`ServiceRoute.made`) and checks it again while it leads; a
replica that stops leading, or starts, empties it if it still names its pod
(:meth:`ServiceRoute.named_here`), at the version it read, so that it never erases what a new
leader wrote meanwhile. The slice is owned by the pod that last routed to itself: it goes
with the operator's pods when the operator is uninstalled.

The operator patches no pod for this: its Role lets it make EndpointSlices (a create cannot
be limited by name) and read and update the one of the Service's name, and read pods. The
chart makes no slice: Helm's server-side apply would claim its endpoints, and an upgrade
would then conflict with the leader's writes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Final

PORT_NAME: Final = "rendezvous"
"""The Service port (and EndpointSlice port) the workers' rendezvous requests go to."""
SLICE_VERSIONS: Final = ("discovery.k8s.io/v1", "discovery.k8s.io/v1beta1")
"""The EndpointSlice API versions, preferred first (v1beta1: Kubernetes 1.20)."""
SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
"""The label that ties an EndpointSlice to its Service (kube-proxy reads it)."""
MANAGED_BY_LABEL: Final = "endpointslice.kubernetes.io/managed-by"
MANAGER: Final = "operator.elasticjob.dev"
"""Who manages the slice (not Kubernetes' EndpointSlice controller, which leaves it alone)."""


@dataclass(frozen=True)
class ServiceRoute:
    """The rendezvous Service of an operator running in a pod, and that pod."""

    namespace: str
    service: str
    """The Service's name, which its EndpointSlice shares."""
    pod: str
    pod_uid: str
    address: str
    """The pod's IP address (the downward API's ``status.podIP``)."""
    port: int
    """The port the rendezvous service listens on in the pod."""

    def made(self, version: str) -> dict[str, Any]:
        """A new EndpointSlice of API ``version`` routing the workers to this pod alone."""
        labels = {SERVICE_NAME_LABEL: self.service, MANAGED_BY_LABEL: MANAGER}
        made = {
            "apiVersion": version,
            "kind": "EndpointSlice",
            "metadata": {"name": self.service, "namespace": self.namespace, "labels": labels},
            "addressType": "IPv6" if ":" in self.address else "IPv4",
        }
        return self.routed(made)

    def routed(self, endpoint_slice: dict[str, Any]) -> dict[str, Any]:
        """``endpoint_slice`` as read (its labels, address type and ``resourceVersion``), now
        routing the workers to this pod alone, and owned by it."""
        target = {"kind": "Pod", "namespace": self.namespace, "name": self.pod}
        endpoint = {"addresses": [self.address], "conditions": {"ready": True}}
        owner = {"apiVersion": "v1", "kind": "Pod", "name": self.pod, "uid": self.pod_uid}
        written = copy.deepcopy(endpoint_slice)
        written["metadata"]["ownerReferences"] = [owner]
        written["endpoints"] = [endpoint | {"targetRef": target}]
        written["ports"] = [{"name": PORT_NAME, "port": self.port, "protocol": "TCP"}]
        return written

    def routed_here(self, endpoint_slice: dict[str, Any]) -> bool:
        """Whether ``endpoint_slice`` routes the workers to this pod's rendezvous port, and
        names no other endpoint, ready or not."""
        endpoints = endpoint_slice.get("endpoints") or []
        ports = [(p.get("name"), p.get("port")) for p in endpoint_slice.get("ports") or []]
        return (
            len(endpoints) == 1
            and _ready(endpoints[0])
            and endpoints[0].get("addresses") == [self.address]
            and (endpoints[0].get("targetRef") or {}).get("name") == self.pod
            and ports == [(PORT_NAME, self.port)]
        )

    def named_here(self, endpoint_slice: dict[str, Any]) -> bool:
        """Whether ``endpoint_slice`` names this pod's address at all."""
        return any(
            self.address in (endpoint.get("addresses") or [])
            for endpoint in endpoint_slice.get("endpoints") or []
        )


def unrouted(endpoint_slice: dict[str, Any]) -> dict[str, Any]:
    """``endpoint_slice`` as read, now routing the workers nowhere."""
    return copy.deepcopy(endpoint_slice) | {"endpoints": []}


def _ready(endpoint: dict[str, Any]) -> bool:
    """An endpoint is ready unless it says otherwise (the API's reading of an unset field)."""
    return (endpoint.get("conditions") or {}).get("ready") is not False
