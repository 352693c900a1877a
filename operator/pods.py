"""Worker pods as the operator sees them: their manifests, and what a pod's state means for
the driver. Pure functions over plain dicts (the API objects), table-testable."""

from __future__ import annotations

import copy
import enum
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob.driver.driver_types import JobMode
from elasticjob.library_env import WORKER_DEFAULTS
from elasticjob.operator.api import (
    API_VERSION,
    KIND,
    LABEL_HEALTH_CHECK,
    LABEL_JOB_NAME,
    CheckpointSpec,
    ElasticJobSpec,
    worker_labels,
)
from elasticjob.operator.pod_launcher import driver_settings, job_recovery
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.worker_contract import (
    SecretKey,
    WorkerSettings,
    health_check_command,
    pod_env,
    restart_agent_command,
    slots_command,
)

KEY_KEY = "key"
"""Key of the job's rendezvous key in its Secret (``elasticjob.rendezvous.job_credentials``:
every credential of the job derives from it; no pod reads it)."""
READER_KEY = "reader"
"""Key of the job's reader token in its Secret (reads the job's round, plan and notices;
speaks for no worker): for people and tools. Each pod's own credential is under the pod's
name (``pod_credentials``)."""
POD_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The letters of a pod name's random suffix (the API server's, for ``generateName``)."""
POD_NAME_MAX = 63
"""The longest pod name (a pod's host name is its name, a DNS label)."""


def job_id(namespace: str, name: str) -> str:
    """The job's name on the rendezvous service (unique across namespaces)."""
    return f"{namespace}.{name}"


def token_secret_name(job_name: str) -> str:
    return f"{job_name}-rendezvous"


def token_secret(job: Mapping[str, Any]) -> dict[str, Any]:
    """A Secret holding a fresh rendezvous key and its reader token, owned by the job."""
    key = secrets.token_urlsafe(32)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owned_metadata(job, token_secret_name(job["metadata"]["name"])),
        "type": "Opaque",
        "stringData": {KEY_KEY: key, READER_KEY: JobKey(key).reader_token()},
    }


def new_pod_name(job_name: str) -> str:
    """A fresh name for a worker pod of ``job_name``, as ``generateName`` would make it: the
    operator names its pods itself, to hand each its credential before it exists."""
    prefix = f"{job_name}-worker-"[: POD_NAME_MAX - 5]
    return prefix + "".join(secrets.choice(POD_NAME_ALPHABET) for _ in range(5))


def owned_metadata(job: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The metadata of an object ``name`` that ``job`` owns (deleted with it): the job's
    worker labels and its controller owner reference."""
    job_name = job["metadata"]["name"]
    return {
        "name": name,
        "labels": worker_labels(job_name),
        "ownerReferences": [owner_reference(job)],
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def worker_pod(
    job: Mapping[str, Any],
    spec: ElasticJobSpec,
    pod_name: str,
    *,
    rendezvous_url: str,
    rendezvous_ca: str | None = None,
    avoid_nodes: Iterable[str] = (),
) -> dict[str, Any]:
    """The manifest of a new worker pod of ``job`` named ``pod_name`` (:func:`new_pod_name`).

    The pod carries the job's labels and an owner reference, never restarts (the driver
    replaces failed workers), stays off ``avoid_nodes`` (blacklisted) by node affinity,
    prefers a node that holds no other pod of the job (unless the template says how to
    place them: a pod anti-affinity or topology spread constraints), and hands its worker
    container the runtime's environment: the rendezvous URL, the job, its own credential
    from the job's Secret (under its name), its own name as host name and its IP as bind
    address (and the CA certificate to verify an ``https`` rendezvous URL with), and the
    worker defaults of ``library_env`` its ``env`` does not name (torch's huge pages)."""
    name = job["metadata"]["name"]
    namespace = job["metadata"]["namespace"]
    template = spec.template.model_dump(by_alias=True, exclude_none=True)
    metadata = copy.deepcopy(template.get("metadata", {}))
    metadata["name"] = pod_name
    metadata["labels"] = {**metadata.get("labels", {}), **worker_labels(name)}
    if spec.health_check is not None:
        metadata["labels"][LABEL_HEALTH_CHECK] = HealthLabel.PENDING.value
    metadata["ownerReferences"] = [owner_reference(job)]
    pod_spec = copy.deepcopy(template["spec"])
    pod_spec["restartPolicy"] = "Never"
    worker = spec.template.spec.worker_container()
    assert worker is not None, "validated specs have a worker container"
    for container in pod_spec["containers"]:
        if container["name"] == worker.name and spec.mode is JobMode.RESTART:
            # The agent runs the script, and starts it again at each change of the job.
            container["command"] = restart_agent_command(
                "python", [*container.get("command", []), *container.pop("args", [])]
            )
        if container["name"] == worker.name and spec.slots_per_worker > 1:
            # One worker process per slot, each with its local rank.
            container["command"] = slots_command(
                "python",
                spec.slots_per_worker,
                [*container.get("command", []), *container.pop("args", [])],
            )
        if container["name"] == worker.name and spec.health_check is not None:
            # Outermost: one check per pod, before anything of the job runs in it.
            container["command"] = health_check_command(
                "python", [*container.get("command", []), *container.pop("args", [])]
            )
        if container["name"] == worker.name:
            # The template's, the worker defaults it does not name, the operator's last: in
            # Kubernetes the later of two entries wins (admission refuses a template that
            # sets the operator's).
            env = container.get("env", [])
            named = {entry["name"] for entry in env}
            container["env"] = [
                *env,
                *(
                    {"name": d.variable, "value": d.value}
                    for d in WORKER_DEFAULTS
                    if d.variable not in named
                ),
                *_runtime_env(namespace, name, pod_name, spec, rendezvous_url, rendezvous_ca),
            ]
            if spec.checkpoint is not None:
                _mount_checkpoints(container, spec.checkpoint)
    avoid = sorted(set(avoid_nodes))
    if avoid:
        _add_node_anti_affinity(pod_spec, avoid)
    if "podAntiAffinity" not in pod_spec.get("affinity", {}) and not pod_spec.get(
        "topologySpreadConstraints"
    ):
        _prefer_spreading(pod_spec, name)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _mount_checkpoints(container: dict[str, Any], checkpoint: CheckpointSpec) -> None:
    """Mount the checkpoint volume at its path in the worker container (unless it is
    already)."""
    mounts = container.setdefault("volumeMounts", [])
    path = checkpoint.path.rstrip("/")
    if not any(m.get("mountPath", "").rstrip("/") == path for m in mounts):
        mounts.append({"name": checkpoint.volume, "mountPath": checkpoint.path})


def _runtime_env(
    namespace: str,
    name: str,
    pod_name: str,
    spec: ElasticJobSpec,
    rendezvous_url: str,
    rendezvous_ca: str | None,
) -> list[dict[str, Any]]:
    """The worker contract's variables of the job's pods (None: the worker's default)."""
    settings = WorkerSettings.model_validate(
        {
            "rendezvous_url": rendezvous_url,
            "rendezvous_ca": rendezvous_ca or None,
            "job": job_id(namespace, name),
            "backend": spec.backend.value,
            "defer_sigterm": True,
            "collective_timeout_s": spec.collective_timeout_seconds,
            "round_wait_s": spec.round_wait_seconds,
            "heartbeat_interval_s": driver_settings(spec).heartbeat_interval_s,
            "checkpoint": spec.checkpoint.policy() if spec.checkpoint is not None else None,
            "max_restarts": job_recovery(spec).script_max_restarts,
            "warm_start": (
                spec.warm_start
                if spec.mode is JobMode.RESTART or spec.slots_per_worker > 1
                else None
            ),
        }
    )
    return pod_env(settings, token=SecretKey(token_secret_name(name), pod_name))


def _prefer_spreading(pod_spec: dict[str, Any], job_name: str) -> None:
    """Prefer nodes without another pod of the job: a blacklisted node (a failure there)
    then takes one worker out, not several, and one node's loss costs one host. A
    preference only: where nodes are few, pods share them. (A scheduler left alone packs
    them onto the nodes that already hold the image.)"""
    pod_spec.setdefault("affinity", {})["podAntiAffinity"] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {LABEL_JOB_NAME: job_name}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }


def _add_node_anti_affinity(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": nodes}
        ]
    }
    required = (
        pod_spec.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []})
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append(term)
    else:  # terms are ORed: every term must also exclude the nodes
        for existing in terms:
            existing.setdefault("matchExpressions", []).extend(term["matchExpressions"])


class PodState(enum.Enum):
    """What a worker pod means for the job."""

    PENDING = "pending"
    """Not running yet (being scheduled or started)."""
    RUNNING = "running"
    """Its worker processes run: it is a host the driver may use."""
    LEAVING = "leaving"
    """Being deleted or preempted: its workers leave gracefully."""
    SUCCEEDED = "succeeded"
    """Its processes exited 0."""
    FAILED = "failed"
    """Its processes failed, or it was lost."""


class HealthLabel(enum.StrEnum):
    """The values of a pod's health-check label (``LABEL_HEALTH_CHECK``)."""

    PENDING = "Pending"
    PASSED = "Passed"


@dataclass(frozen=True)
class PodView:
    """The parts of a worker pod the operator acts on."""

    name: str
    state: PodState
    node: str | None
    ip: str | None
    created: str
    exit_code: int | None = None
    reason: str = ""
    unschedulable: str | None = None
    """The scheduler's message while a pending pod fits no node."""
    unchecked: bool = False
    """It was created to be checked before it joins, and has not passed yet."""


def view(pod: Mapping[str, Any], *, not_ready_nodes: Iterable[str] = ()) -> PodView:
    """Classify a pod (see :class:`PodState`) by what its object says (what the controller
    did to it is the job's ledger's: ``pod_ledger.PodLedger.views``)."""
    metadata, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    node = spec.get("nodeName")
    phase = status.get("phase", "Pending")
    exit_code, ended_for = _exit(status)
    state: PodState
    reason = status.get("reason", "")
    if phase == "Failed" or (exit_code not in (None, 0)):
        state = PodState.FAILED
        why = f" ({ended_for})" if ended_for not in (None, "Error", "Completed") else ""
        reason = reason or f"worker exited with {exit_code}{why}"
    elif phase == "Succeeded":
        state = PodState.SUCCEEDED
    elif node is not None and node in set(not_ready_nodes):
        state, reason = PodState.FAILED, f"node {node} is not ready"
    elif metadata.get("deletionTimestamp") or _disruption_target(status):
        state, reason = PodState.LEAVING, reason or "deleted or preempted"
    elif phase == "Running":
        state = PodState.RUNNING
    else:
        state = PodState.PENDING
    unschedulable = _unschedulable(status) if state is PodState.PENDING else None
    return PodView(
        name=metadata["name"],
        state=state,
        node=node,
        ip=status.get("podIP"),
        created=metadata.get("creationTimestamp", ""),
        exit_code=exit_code,
        reason=reason,
        unschedulable=unschedulable,
        unchecked=_unchecked(metadata.get("labels") or {}),
    )


def _unchecked(labels: Mapping[str, Any]) -> bool:
    label = labels.get(LABEL_HEALTH_CHECK)
    return label is not None and label != HealthLabel.PASSED


def _exit(status: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The exit code of the pod's first ended container, and the kubelet's reason for its end
    (``OOMKilled``, ``Error``...)."""
    for container in status.get("containerStatuses", []) or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None and terminated.get("exitCode") is not None:
            return int(terminated["exitCode"]), terminated.get("reason")
    return None, None


def _unschedulable(status: Mapping[str, Any]) -> str | None:
    for condition in status.get("conditions", []) or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return str(condition.get("message") or "no node fits the pod")
    return None


def _disruption_target(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in status.get("conditions", []) or []
    )


def newest_first(pods: Iterable[PodView], count: int) -> list[PodView]:
    """The ``count`` most recently created pods: the ones scale-in removes (the oldest keep
    rank 0 and the freshest state)."""
    return sorted(pods, key=lambda p: (p.created, p.name), reverse=True)[:count]


def job_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the job a worker pod belongs to."""
    labels = pod.get("metadata", {}).get("labels") or {}
    value = labels.get(LABEL_JOB_NAME)
    return str(value) if value is not None else None
