"""Container state and pod status documents, shaped like a kubelet's."""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import dataclass, field
from typing import Any

from devcluster.agent.kubeapi import Obj

OWN_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def now() -> str:
    """RFC 3339 timestamp, second precision, UTC."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    """RFC 3339 timestamp with microseconds (for Lease renewTime)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Container:
    """Runtime state of one container of a pod."""

    spec: Obj
    init: bool = False
    image_id: str = ""
    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: True once the container has finished for good (no restart coming).
    done: bool = False
    container_id: str = ""

    @property
    def name(self) -> str:
        """Container name."""
        return str(self.spec["name"])

    @property
    def exit_code(self) -> int | None:
        """Exit code if terminated."""
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])

    def waiting(self, reason: str, message: str = "") -> None:
        """Enter the waiting state."""
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        self.ready = False

    def running(self, pid: int) -> None:
        """Enter the running state."""
        self.state = {"running": {"startedAt": now()}}
        self.started = True
        self.container_id = f"devcluster://{pid}"

    def terminated(self, code: int, reason: str | None = None, message: str = "") -> None:
        """Enter the terminated state."""
        started = self.state.get("running", {}).get("startedAt", now())
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": started,
            "finishedAt": now(),
        }
        if message:
            term["message"] = message
        if self.container_id:
            term["containerID"] = self.container_id
        self.state = {"terminated": term}
        self.ready = False
        self.started = False

    def to_status(self) -> Obj:
        """An entry of containerStatuses."""
        status: Obj = {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id,
            "started": self.started,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def _condition(
    kind: str, ok: bool, previous: dict[str, Obj], reason: str = "", message: str = ""
) -> Obj:
    value = "True" if ok else "False"
    old = previous.get(kind)
    changed = old is None or old.get("status") != value
    cond: Obj = {
        "type": kind,
        "status": value,
        "lastProbeTime": None,
        "lastTransitionTime": now() if changed else old.get("lastTransitionTime") if old else now(),
    }
    if reason and not ok:
        cond["reason"] = reason
    if message and not ok:
        cond["message"] = message
    return cond


def pod_status(
    pod: Obj,
    phase: str,
    init: list[Container],
    app: list[Container],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    extra_conditions: list[Obj],
) -> Obj:
    """The full ``status`` of a pod; conditions keep their transition times."""
    current = pod.get("status", {})
    previous = {c["type"]: c for c in current.get("conditions") or []}
    initialized = all(c.exit_code == 0 for c in init)
    unready = [c.name for c in app if not c.ready]
    terminal = phase in ("Succeeded", "Failed")
    reason = "PodCompleted" if terminal else "ContainersNotReady"
    message = "" if terminal else f"containers with unready status: [{' '.join(unready)}]"
    conditions = [
        _condition("Initialized", initialized, previous, "ContainersNotInitialized"),
        _condition("Ready", not unready and not terminal, previous, reason, message),
        _condition("ContainersReady", not unready and not terminal, previous, reason, message),
        previous.get("PodScheduled") or _condition("PodScheduled", True, previous),
    ]
    by_type = {c["type"]: c for c in conditions}
    for cond in [*(current.get("conditions") or []), *extra_conditions]:
        if cond["type"] not in OWN_CONDITIONS:
            by_type[cond["type"]] = cond
    status: Obj = {
        "phase": phase,
        "conditions": list(by_type.values()),
        "hostIP": host_ip,
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "containerStatuses": [c.to_status() for c in app],
    }
    if init:
        status["initContainerStatuses"] = [c.to_status() for c in init]
    return status
