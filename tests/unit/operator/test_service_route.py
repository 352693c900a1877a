"""Which EndpointSlices route the workers to a replica's pod alone, and which name it at all
(a table), and the slice a replica writes."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.operator.service_route import ServiceRoute, unrouted

ME = ServiceRoute("system", "elasticjob-operator", "op-b", "uid-b", "10.0.0.2", 8470)
OTHER = ServiceRoute("system", "elasticjob-operator", "op-c", "uid-c", "10.0.0.3", 8470)
READ = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": ME.service,
        "resourceVersion": "42",
        "labels": {"kubernetes.io/service-name": ME.service},
    },
    "addressType": "IPv4",
    "ports": [{"name": "rendezvous", "port": 8470, "protocol": "TCP"}],
}
"""A slice as read, routing nowhere."""


def endpoint(route: ServiceRoute, ready: bool | None = True) -> dict[str, Any]:
    found: dict[str, Any] = {"addresses": [route.address], "targetRef": {"name": route.pod}}
    return found | ({} if ready is None else {"conditions": {"ready": ready}})


def sliced(*endpoints: dict[str, Any], port: int = 8470) -> dict[str, Any]:
    ports = [{"name": "rendezvous", "port": port, "protocol": "TCP"}]
    return READ | {"endpoints": list(endpoints), "ports": ports}


@pytest.mark.parametrize(
    ("found", "routed_here", "named_here"),
    [
        pytest.param(READ, False, False, id="without endpoints"),
        pytest.param(sliced(), False, False, id="emptied"),
        pytest.param(sliced(endpoint(ME)), True, True, id="this pod alone"),
        pytest.param(sliced(endpoint(ME, ready=None)), True, True, id="readiness unknown"),
        pytest.param(sliced(endpoint(OTHER)), False, False, id="another pod"),
        pytest.param(sliced(endpoint(ME), endpoint(OTHER)), False, True, id="and another"),
        pytest.param(sliced(endpoint(ME), endpoint(OTHER, False)), False, True, id="and unready"),
        pytest.param(sliced(endpoint(ME), port=9000), False, True, id="another port"),
        pytest.param(sliced(endpoint(ME, ready=False)), False, True, id="not ready"),
    ],
)
def test_routed_here_and_named_here(
    found: dict[str, Any], routed_here: bool, named_here: bool
) -> None:
    assert ME.routed_here(found) is routed_here
    assert ME.named_here(found) is named_here


def test_the_written_slice_keeps_what_was_read_names_the_pod_and_is_owned_by_it() -> None:
    written = ME.routed(sliced(endpoint(OTHER)))
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "op-b", "uid": "uid-b"}
    assert written["metadata"] == READ["metadata"] | {"ownerReferences": [owner]}
    assert {k: v for k, v in written.items() if k not in ("endpoints", "metadata")} == {
        k: v for k, v in READ.items() if k != "metadata"
    }
    assert written["endpoints"] == [
        {
            "addresses": ["10.0.0.2"],
            "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "namespace": "system", "name": "op-b"},
        }
    ]
    assert ME.routed_here(written) and not OTHER.named_here(written)
    emptied = unrouted(written)
    assert emptied == written | {"endpoints": []} and not ME.named_here(emptied)


@pytest.mark.parametrize(("address", "family"), [("10.0.0.2", "IPv4"), ("fd00::2", "IPv6")])
def test_a_made_slice_belongs_to_the_service_and_has_the_pods_address_family(
    address: str, family: str
) -> None:
    route = ServiceRoute("system", "elasticjob-operator", "op-b", "uid-b", address, 8470)
    made = route.made("discovery.k8s.io/v1beta1")
    assert made["apiVersion"] == "discovery.k8s.io/v1beta1" and made["kind"] == "EndpointSlice"
    assert made["metadata"]["name"] == "elasticjob-operator"
    assert made["metadata"]["namespace"] == "system"
    assert made["metadata"]["labels"] == {
        "kubernetes.io/service-name": "elasticjob-operator",
        "endpointslice.kubernetes.io/managed-by": "operator.elasticjob.dev",
    }
    assert made["addressType"] == family
    assert route.routed_here(made) and made["metadata"]["ownerReferences"][0]["uid"] == "uid-b"
