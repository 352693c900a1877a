"""Worker pods: the manifest the operator creates, and what a pod's state means."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.library_env import ENV_TORCH_HUGE_PAGES, WORKER_DEFAULTS
from elasticjob.operator.api import LABEL_HEALTH_CHECK, ElasticJobSpec, parse_spec
from elasticjob.operator.pod_launcher import driver_settings
from elasticjob.operator.pods import PodState, PodView, newest_first, view, worker_pod
from elasticjob.worker_contract import (
    ENV_BACKEND,
    ENV_BIND_ADDRESS,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_DEFER_SIGTERM,
    ENV_HEARTBEAT_INTERVAL,
    ENV_HOROVOD_HOSTNAME,
    ENV_HOROVOD_LOCAL_RANK,
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_MAX_RESTARTS,
    ENV_NODE,
    ENV_RENDEZVOUS_CA,
    ENV_RENDEZVOUS_URL,
    ENV_ROUND_WAIT,
    ENV_TOKEN,
    ENV_TORCH_LOCAL_RANK,
    ENV_WARM_START,
    HEALTH_CHECK_MODULE,
    RESTART_AGENT_MODULE,
    WORKER_CONTRACT_ENV,
    is_worker_contract_env,
)
from tests.support.crd_model import with_changes

JOB = {"metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"}}
POD = "train-worker-b2c4d"
"""A worker pod's name, as the operator makes it (``new_pod_name``)."""
AGENT = RESTART_AGENT_MODULE
CHECK = HEALTH_CHECK_MODULE
TRAIN = ["train", "--lr", "1"]
SLOTS = "elasticjob.worker_runtime.agents.slot_supervisor"
HOST_NOT_IN = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}


def spec_with(pod_spec: dict[str, Any], **changes: Any) -> ElasticJobSpec:
    template = {"metadata": {"labels": {"team": "a"}}, "spec": pod_spec}
    return parse_spec(with_changes(template=template, **changes))


WORKER = {
    "name": "worker",
    "image": "img",
    "command": ["train"],
    "env": [{"name": "X", "value": "1"}],
}


def test_worker_pod_carries_the_template_and_the_runtime_contract() -> None:
    spec = spec_with(
        {
            "containers": [WORKER, {"name": "sidecar", "image": "side"}],
            "schedulerName": "gang",
            "priorityClassName": "high",
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "restartPolicy": "Always",
        },
        backend="gloo",
    )
    pod = worker_pod(JOB, spec, POD, rendezvous_url="http://rdzv:8470")
    meta, pod_spec = pod["metadata"], pod["spec"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert meta["name"] == POD and "generateName" not in meta
    assert meta["labels"] == {
        "team": "a",
        "elasticjob.dev/job-name": "train",
        "elasticjob.dev/role": "worker",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "elasticjob.dev/v1alpha1",
            "kind": "ElasticJob",
            "name": "train",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["schedulerName"] == "gang"
    assert pod_spec["priorityClassName"] == "high"
    assert pod_spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert set(pod_spec["affinity"]) == {"podAntiAffinity"}, "spread by default"
    worker, sidecar = pod_spec["containers"]
    assert worker["command"] == ["train"]
    assert "env" not in sidecar
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in worker["env"]}
    assert env == {
        ENV_RENDEZVOUS_URL: "http://rdzv:8470",
        ENV_JOB: "ml.train",
        # the pod's own credential, under its name: never the job's key
        ENV_TOKEN: {"secretKeyRef": {"name": "train-rendezvous", "key": POD}},
        ENV_HOSTNAME: {"fieldRef": {"fieldPath": "metadata.name"}},
        ENV_NODE: {"fieldRef": {"fieldPath": "spec.nodeName"}},
        ENV_BIND_ADDRESS: {"fieldRef": {"fieldPath": "status.podIP"}},
        ENV_LOCAL_RANK: "0",
        ENV_HOROVOD_HOSTNAME: {"fieldRef": {"fieldPath": "metadata.name"}},
        ENV_HOROVOD_LOCAL_RANK: "0",
        ENV_TORCH_LOCAL_RANK: "0",
        ENV_BACKEND: "gloo",
        ENV_DEFER_SIGTERM: "1",
        ENV_HEARTBEAT_INTERVAL: "1",
        ENV_TORCH_HUGE_PAGES: "1",  # a worker default
        "X": "1",
    }
    # The template's, the worker defaults, the operator's variables last: in Kubernetes the
    # later of two entries wins.
    assert worker["env"][:2] == [
        {"name": "X", "value": "1"},
        {"name": ENV_TORCH_HUGE_PAGES, "value": "1"},
    ]
    assert all(is_worker_contract_env(e["name"]) for e in worker["env"][2:])


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_template_that_names_a_worker_default_keeps_its_value(value: str) -> None:
    """``THP_MEM_ALLOC_ENABLE=0`` in the template turns torch's huge pages off: the
    operator does not add its default beside it."""
    mine = {"name": ENV_TORCH_HUGE_PAGES, "value": value}
    spec = spec_with({"containers": [{**WORKER, "env": [mine]}]})
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    assert [e for e in worker["env"] if e["name"] == ENV_TORCH_HUGE_PAGES] == [mine]


def test_the_operators_env_wins_over_a_template_that_sets_it() -> None:
    """Admission refuses such a template; should one get through, the operator's values are
    still the ones the worker sees (Kubernetes uses the last of two entries)."""
    planted = {"name": ENV_TOKEN, "valueFrom": {"secretKeyRef": {"name": "other", "key": "t"}}}
    template = {"spec": {"containers": [{**WORKER, "env": [planted]}]}}
    spec = ElasticJobSpec.model_validate(with_changes(template=template))
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    last = {e["name"]: e for e in worker["env"]}
    assert last[ENV_TOKEN]["valueFrom"]["secretKeyRef"]["name"] == "train-rendezvous"


def test_every_variable_the_operator_sets_is_in_the_worker_contract() -> None:
    """The one list admission refuses in templates covers everything the pods get."""
    spec = spec_with(
        {"containers": [WORKER]},
        slotsPerWorker=2,
        collectiveTimeoutSeconds=30,
        roundWaitSeconds=120,
        heartbeatTimeoutSeconds=5,
    )
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    names = {e["name"] for e in worker["env"]} - {"X"} - {d.variable for d in WORKER_DEFAULTS}
    assert names <= WORKER_CONTRACT_ENV
    assert all(is_worker_contract_env(name) for name in names)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, {}),
        (
            {"collectiveTimeoutSeconds": 30, "roundWaitSeconds": 120},
            {ENV_COLLECTIVE_TIMEOUT: "30", ENV_ROUND_WAIT: "120"},
        ),
        ({"roundWaitSeconds": 5}, {ENV_ROUND_WAIT: "5"}),
    ],
)
def test_worker_timeouts_are_spec_fields_passed_to_the_workers(
    changes: dict[str, Any], expected: dict[str, str]
) -> None:
    spec = spec_with({"containers": [WORKER]}, **changes)
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    knobs = (ENV_COLLECTIVE_TIMEOUT, ENV_ROUND_WAIT)
    assert {k: v for k, v in env.items() if k in knobs} == expected


@pytest.mark.parametrize(
    "ca", ["-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n", None]
)
def test_worker_pod_gets_the_rendezvous_ca_only_with_tls(ca: str | None) -> None:
    spec = spec_with({"containers": [WORKER]})
    url = "https://rdzv:8470" if ca else "http://rdzv:8470"
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url=url, rendezvous_ca=ca)["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env[ENV_RENDEZVOUS_URL] == url
    assert env.get(ENV_RENDEZVOUS_CA) == ca


@pytest.mark.parametrize(("timeout", "interval"), [(5, "1"), (20, "2"), (1, "0.2"), (0, None)])
def test_worker_pod_beats_at_the_interval_of_the_heartbeat_timeout(
    timeout: int, interval: str | None
) -> None:
    spec = spec_with({"containers": [WORKER]}, heartbeatTimeoutSeconds=timeout)
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="http://rdzv:8470")["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env.get(ENV_HEARTBEAT_INTERVAL) == interval, "0: eviction off, no heartbeat"


def test_worker_pod_runs_a_process_per_slot() -> None:
    spec = spec_with({"containers": [{**WORKER, "args": ["--lr", "1"]}]}, slotsPerWorker=2)
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    assert worker["command"] == [
        "python",
        "-m",
        "elasticjob.worker_runtime.agents.slot_supervisor",
        "2",
        "--",
        "train",
        "--lr",
        "1",
    ]
    assert "args" not in worker


@pytest.mark.parametrize(
    ("slots", "max_restarts", "command", "limit"),
    [
        pytest.param(1, None, ["-m", AGENT, "--", *TRAIN], "3", id="default-limit"),
        pytest.param(
            2,
            5,
            [
                "-m",
                "elasticjob.worker_runtime.agents.slot_supervisor",
                "2",
                "--",
                "python",
                "-m",
                AGENT,
                "--",
                *TRAIN,
            ],
            "5",
            id="an-agent-per-slot",
        ),
    ],
)
def test_a_restart_mode_pod_runs_the_script_under_its_agent(
    slots: int, max_restarts: int | None, command: list[str], limit: str
) -> None:
    spec = spec_with(
        {"containers": [{**WORKER, "args": ["--lr", "1"]}]},
        slotsPerWorker=slots,
        mode="restart",
        maxRestarts=max_restarts,
    )
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    assert worker["command"] == ["python", *command] and "args" not in worker
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env[ENV_MAX_RESTARTS] == limit, "the script reads it as TORCHELASTIC_MAX_RESTARTS"
    assert driver_settings(spec).checkpoint_fallback, "losing every pod is no end of the job"


def test_an_elastic_pod_tells_no_restart_limit() -> None:
    spec = spec_with({"containers": [WORKER]}, maxRestarts=2, warmStart=False)
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    names = {e["name"] for e in worker["env"]}
    assert ENV_MAX_RESTARTS not in names and ENV_WARM_START not in names, "no agent reads them"
    assert driver_settings(spec).restart_limit == 2


@pytest.mark.parametrize(
    ("changes", "command"),
    [
        pytest.param({}, ["-m", CHECK, "--", *TRAIN], id="elastic"),
        pytest.param(
            {"slotsPerWorker": 2},
            ["-m", CHECK, "--", "python", "-m", SLOTS, "2", "--", *TRAIN],
            id="one-check-per-pod-before-its-slots",
        ),
        pytest.param(
            {"mode": "restart"},
            ["-m", CHECK, "--", "python", "-m", AGENT, "--", *TRAIN],
            id="before-the-restart-agent",
        ),
    ],
)
def test_a_checked_pod_runs_its_health_check_first_and_is_labelled_pending(
    changes: dict[str, Any], command: list[str]
) -> None:
    spec = spec_with({"containers": [{**WORKER, "args": ["--lr", "1"]}]}, healthCheck={}, **changes)
    pod = worker_pod(JOB, spec, POD, rendezvous_url="u")
    (worker,) = pod["spec"]["containers"]
    assert worker["command"] == ["python", *command] and "args" not in worker
    assert pod["metadata"]["labels"][LABEL_HEALTH_CHECK] == "Pending"
    assert view(created(pod)).unchecked
    passed = created(pod)
    passed["metadata"]["labels"][LABEL_HEALTH_CHECK] = "Passed"
    assert not view(passed).unchecked


def test_an_unchecked_pod_carries_no_health_label() -> None:
    pod = worker_pod(JOB, spec_with({"containers": [WORKER]}), POD, rendezvous_url="u")
    assert LABEL_HEALTH_CHECK not in pod["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["command"] == ["train"]
    assert not view(created(pod)).unchecked


def created(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the API server returns it: named from its prefix."""
    metadata = {**pod["metadata"], "labels": dict(pod["metadata"]["labels"]), "name": "p-1"}
    return {**pod, "metadata": metadata}


@pytest.mark.parametrize(("warm_start", "value"), [(None, "1"), (True, "1"), (False, "0")])
def test_a_restart_mode_pod_tells_its_agent_whether_to_start_warm(
    warm_start: bool | None, value: str
) -> None:
    fields = {} if warm_start is None else {"warmStart": warm_start}
    spec = spec_with({"containers": [WORKER]}, mode="restart", **fields)
    (worker,) = worker_pod(JOB, spec, POD, rendezvous_url="u")["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in worker["env"]}[ENV_WARM_START] == value


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        (None, {"nodeSelectorTerms": [{"matchExpressions": [HOST_NOT_IN]}]}),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["x"]}
                                ]
                            },
                        ]
                    }
                }
            },
            {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["a"]},
                            HOST_NOT_IN,
                        ]
                    },
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["x"]}
                        ],
                        "matchExpressions": [HOST_NOT_IN],
                    },
                ]
            },
        ),
        (
            {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            {"nodeSelectorTerms": [{"matchExpressions": [HOST_NOT_IN]}]},
        ),
    ],
    ids=["no-affinity", "user-node-affinity", "other-affinity"],
)
def test_blacklisted_nodes_are_excluded_from_every_node_selector_term(
    affinity: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    pod_spec: dict[str, Any] = {"containers": [WORKER]}
    if affinity is not None:
        pod_spec["affinity"] = affinity
    spec = spec_with(pod_spec)
    pod = worker_pod(JOB, spec, POD, rendezvous_url="u", avoid_nodes={"n2": 1.0, "n1": 2.0})
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == expected
    if affinity and "podAntiAffinity" in affinity:
        assert pod["spec"]["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]
    # The spec's template is not changed by making a pod from it.
    assert spec.template.spec.model_dump(by_alias=True, exclude_none=True) == pod_spec


SPREAD = {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"elasticjob.dev/job-name": "train"}},
                "topologyKey": "kubernetes.io/hostname",
            },
        }
    ]
}
USER_ANTI_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"team": "a"}}, "topologyKey": "zone"}
    ]
}
ZONE_SPREAD = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]


@pytest.mark.parametrize(
    ("placement", "anti_affinity"),
    [
        ({}, SPREAD),
        ({"affinity": {"nodeAffinity": {}}}, SPREAD),
        ({"affinity": {"podAntiAffinity": USER_ANTI_AFFINITY}}, USER_ANTI_AFFINITY),
        ({"topologySpreadConstraints": ZONE_SPREAD}, None),
    ],
    ids=["default", "with-node-affinity", "user-anti-affinity", "user-spread-constraints"],
)
def test_worker_pods_prefer_nodes_without_another_pod_of_the_job_unless_the_template_says(
    placement: dict[str, Any], anti_affinity: dict[str, Any] | None
) -> None:
    pod_spec = {"containers": [WORKER], **placement}
    pod = worker_pod(JOB, spec_with(pod_spec), POD, rendezvous_url="u")
    assert (pod["spec"].get("affinity") or {}).get("podAntiAffinity") == anti_affinity
    assert pod["spec"].get("topologySpreadConstraints") == placement.get(
        "topologySpreadConstraints"
    )


def manifest(
    phase: str = "Running",
    node: str | None = "n1",
    exit_code: int | None = None,
    deleting: bool = False,
    conditions: list[dict[str, str]] | None = None,
    reason: str | None = None,
    ended_for: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    status: dict[str, Any] = {"phase": phase, "podIP": "10.0.0.1", "conditions": conditions or []}
    if reason:
        status["reason"] = reason
    if exit_code is not None:
        terminated = {"exitCode": exit_code, **({"reason": ended_for} if ended_for else {})}
        status["containerStatuses"] = [{"state": {"terminated": terminated}}]
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient cpu.",
}
DISRUPTED = {"type": "DisruptionTarget", "status": "True"}


@pytest.mark.parametrize(
    ("pod", "state", "reason", "unschedulable"),
    [
        (manifest("Failed", reason="Evicted"), PodState.FAILED, "Evicted", None),
        (manifest("Running", exit_code=137), PodState.FAILED, "worker exited with 137", None),
        (
            manifest("Failed", exit_code=137, ended_for="OOMKilled"),
            PodState.FAILED,
            "worker exited with 137 (OOMKilled)",
            None,
        ),
        (
            manifest("Failed", exit_code=1, ended_for="Error"),
            PodState.FAILED,
            "worker exited with 1",
            None,
        ),
        (manifest("Succeeded", exit_code=0), PodState.SUCCEEDED, "", None),
        (manifest("Running", node="down"), PodState.FAILED, "node down is not ready", None),
        (manifest(deleting=True), PodState.LEAVING, "deleted or preempted", None),
        (manifest(conditions=[DISRUPTED]), PodState.LEAVING, "deleted or preempted", None),
        (manifest(), PodState.RUNNING, "", None),
        (manifest("Pending", node=None), PodState.PENDING, "", None),
        (
            manifest("Pending", node=None, conditions=[UNSCHEDULABLE]),
            PodState.PENDING,
            "",
            "0/3 nodes are available: 3 Insufficient cpu.",
        ),
        (
            manifest(
                "Pending", node=None, conditions=[{**UNSCHEDULABLE, "reason": "SchedulerError"}]
            ),
            PodState.PENDING,
            "",
            None,
        ),
        ({"metadata": {"name": "p"}}, PodState.PENDING, "", None),
    ],
    ids=[
        "failed",
        "nonzero-exit",
        "oom-killed",
        "error",
        "succeeded",
        "node-not-ready",
        "deleting",
        "disruption-target",
        "running",
        "pending",
        "unschedulable",
        "not-scheduled-otherwise",
        "bare",
    ],
)
def test_view_classifies_pods(
    pod: dict[str, Any], state: PodState, reason: str, unschedulable: str | None
) -> None:
    got = view(pod, not_ready_nodes={"down"})
    assert (got.state, got.reason, got.unschedulable) == (state, reason, unschedulable)


def test_view_reads_name_node_ip_and_exit_code() -> None:
    assert view(manifest("Running", exit_code=3)) == PodView(
        "p", PodState.FAILED, "n1", "10.0.0.1", "2026-01-01T00:00:00Z", 3, "worker exited with 3"
    )


def test_newest_first() -> None:
    pods = [
        PodView(n, PodState.RUNNING, None, None, c) for n, c in [("a", "1"), ("b", "3"), ("c", "2")]
    ]
    assert [p.name for p in newest_first(pods, 2)] == ["b", "c"]
