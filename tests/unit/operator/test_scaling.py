"""The operator's scaling decision: the spec's replica count (clamped), and which pods to
create, drain or delete."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from elasticjob.operator.api import CleanPodPolicy, ElasticJobSpec, InvalidSpecError
from elasticjob.operator.pods import PodState, PodView
from elasticjob.operator.scaling import (
    PodPlan,
    ReplicasClamp,
    SpecReader,
    plan_pods,
    pods_to_clean,
    read_spec,
)
from tests.support.crd_model import with_changes

# --- read_spec: out-of-range replicas are clamped, other errors refused -------------------


@pytest.mark.parametrize(
    ("changes", "replicas", "clamp"),
    [
        ({}, 3, None),
        ({"replicas": 9}, 5, ReplicasClamp(9, 5, 2, 5)),
        ({"replicas": 1}, 2, ReplicasClamp(1, 2, 2, 5)),
        ({"replicas": 5}, 5, None),
        ({"replicas": 4, "minReplicas": ...}, 4, None),
        ({"replicas": 7, "minReplicas": ...}, 5, ReplicasClamp(7, 5, 1, 5)),
    ],
    ids=["in-range", "above-max", "below-min", "at-max", "default-min", "default-min-above"],
)
def test_read_spec_clamps_replicas(
    changes: dict[str, Any], replicas: int, clamp: ReplicasClamp | None
) -> None:
    spec, got = read_spec(with_changes(**changes))
    assert spec.replicas == replicas
    assert got == clamp


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"minReplicas": 4, "maxReplicas": 3, "replicas": 3}, "spec.minReplicas"),
        ({"minReplicas": 4, "maxReplicas": 3, "replicas": 9}, "spec.minReplicas"),
        ({"replicas": "9"}, "spec.replicas"),
        ({"replicas": True}, "spec.replicas"),
        (
            {"replicas": 9, "template": {"spec": {"containers": []}}},
            "spec.template.spec.containers",
        ),
        ({"replicas": 9, "maxReplicas": ...}, "spec.maxReplicas"),
    ],
    ids=["min-above-max", "min-above-max-and-out", "string", "bool", "also-bad", "no-max"],
)
def test_read_spec_refuses_what_clamping_cannot_fix(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        read_spec(with_changes(**changes))
    assert field in {e.field for e in refused.value.errors}


def test_a_clamp_says_what_it_did() -> None:
    assert str(ReplicasClamp(9, 5, 2, 5)) == (
        "spec.replicas 9 is outside [2, 5]; running 5 worker pods"
    )


# --- plan_pods ------------------------------------------------------------------------------


def pod(
    name: str, state: PodState = PodState.RUNNING, node: str | None = None, created: str = ""
) -> PodView:
    return PodView(
        name, state, node or f"node-{name}", None, created or f"2026-01-01T00:00:{name[-1]}0Z"
    )


def spec(replicas: int = 3, scope: str = "Node") -> ElasticJobSpec:
    model, _ = read_spec(with_changes(replicas=replicas, blacklist={"scope": scope}))
    return model


# Pods p1..p5 are created in that order (p5 newest).
P = {f"p{i}": pod(f"p{i}") for i in range(1, 6)}


def views(*pods: PodView) -> dict[str, PodView]:
    return {p.name: p for p in pods}


@pytest.mark.parametrize(
    ("job", "pods", "state", "expected"),
    [
        (spec(3), [], {}, PodPlan(create=3)),
        (
            spec(3),
            [P["p1"], P["p2"], P["p3"]],
            {},
            PodPlan(hosts=("p1", "p2", "p3")),
        ),
        (
            spec(3),
            [P["p1"], pod("p2", PodState.PENDING)],
            {},
            PodPlan(create=1, hosts=("p1",)),
        ),
        (  # scale-in: the newest leave; a pending one is deleted at once
            spec(2),
            [P["p1"], P["p2"], P["p3"], pod("p4", PodState.PENDING)],
            {},
            PodPlan(drain=("p4", "p3"), delete=("p4",), hosts=("p1", "p2")),
        ),
        (  # a pod chosen earlier stays chosen and is not counted; no new choice
            spec(2),
            [P["p1"], P["p2"], P["p3"]],
            {"leaving": {"p3": 100.0}},
            PodPlan(hosts=("p1", "p2")),
        ),
        (  # ... until its deadline passes
            spec(2),
            [P["p1"], P["p2"], P["p3"]],
            {"leaving": {"p3": 30.0}},
            PodPlan(overdue=("p3",), hosts=("p1", "p2")),
        ),
        (  # ... unless it was deleted already
            spec(2),
            [P["p1"], P["p2"], P["p3"]],
            {"leaving": {"p3": 30.0}, "deleted": {"p3"}},
            PodPlan(hosts=("p1", "p2")),
        ),
        (  # a chosen pod that is gone is forgotten
            spec(2),
            [P["p1"], P["p2"]],
            {"leaving": {"p3": 100.0}},
            PodPlan(forget=("p3",), hosts=("p1", "p2")),
        ),
        (  # a pod on a blacklisted node is drained and replaced
            spec(2),
            [P["p1"], pod("p2", node="bad")],
            {"blacklisted": {"bad"}},
            PodPlan(create=1, drain=("p2",), hosts=("p1",)),
        ),
        (  # scope Pod: the pod itself is blacklisted, its node is not
            spec(2, "Pod"),
            [P["p1"], pod("p2", node="bad"), P["p3"]],
            {"blacklisted": {"bad", "p3"}},
            PodPlan(drain=("p3",), hosts=("p1", "p2")),
        ),
        (  # failed, succeeded and leaving pods are not live: replacements are created
            spec(3),
            [
                P["p1"],
                pod("p2", PodState.FAILED),
                pod("p3", PodState.SUCCEEDED),
                pod("p4", PodState.LEAVING),
            ],
            {},
            PodPlan(create=2, hosts=("p1",)),
        ),
        (  # a resumed round's members keep their rank order
            spec(3),
            [P["p1"], P["p2"], P["p3"]],
            {"rank_order": ["p3", "p1"]},
            PodPlan(hosts=("p3", "p1", "p2")),
        ),
        (  # a pod still to pass its health check is live but no host yet
            spec(3),
            [P["p1"], P["p2"], dataclasses.replace(P["p3"], unchecked=True)],
            {},
            PodPlan(hosts=("p1", "p2")),
        ),
    ],
    ids=[
        "create-all",
        "steady",
        "pending-counts",
        "scale-in",
        "already-leaving",
        "leaving-overdue",
        "overdue-but-deleted",
        "leaving-gone",
        "blacklisted-node",
        "blacklisted-pod",
        "ended-pods",
        "rank-order",
        "unchecked",
    ],
)
def test_plan_pods(
    job: ElasticJobSpec, pods: list[PodView], state: dict[str, Any], expected: PodPlan
) -> None:
    plan = plan_pods(
        job,
        views(*pods),
        blacklisted=state.get("blacklisted", set()),
        leaving=state.get("leaving", {}),
        deleted=state.get("deleted", set()),
        rank_order=state.get("rank_order", []),
        now=100.0,
        removal_deadline_s=60.0,
    )
    assert plan == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (CleanPodPolicy.ALL, ["p1", "p2", "p3", "p4"]),
        (CleanPodPolicy.RUNNING, ["p1", "p2"]),
        (CleanPodPolicy.NONE, ["p2"]),
    ],
)
def test_pods_to_clean(policy: CleanPodPolicy, expected: list[str]) -> None:
    pods = [
        P["p1"],
        pod("p2", PodState.PENDING),
        pod("p3", PodState.SUCCEEDED),
        pod("p4", PodState.FAILED),
    ]
    assert pods_to_clean(pods, policy) == expected


def test_the_spec_reader_keeps_the_spec_it_last_read() -> None:
    """Every caller gets the spec as last read, whichever copy it held before: the job's
    controller loop and its run read the same spec (a suspension once resumed at once because
    one of them held a copy from before ``suspend: true``)."""
    reader = SpecReader("ns.job", None)
    first = reader.first(with_changes())
    suspended = reader.current(with_changes(suspend=True))
    assert suspended.suspend and not first.suspend
    assert reader.current(with_changes(suspend=True)) is suspended, "unchanged: the same spec"
    assert reader.current(with_changes(suspend=True, maxReplicas=1)) is suspended, "invalid: kept"
