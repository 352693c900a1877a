"""What ``elasticjob submit`` sends: the ElasticJob and the ConfigMap of its code, made from a
:class:`JobRequest` and a :class:`~elasticjob.submit.code_bundle.CodeBundle` by pure functions,
and checked against the same rules as the operator's admission before anything is sent."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from elasticjob.driver.driver_types import JobMode
from elasticjob.operator.api import API_VERSION, GPU_RESOURCE, KIND, WORKER_CONTAINER, validate
from elasticjob.operator.api.validation import name_errors
from elasticjob.submit.code_bundle import CodeBundle
from elasticjob.version import __version__

DEFAULT_IMAGE: Final = f"elasticjob/worker:{__version__}"
"""The worker image of this release: Python, torch (CPU) and elasticjob."""

CODE_DIR: Final = "/opt/elasticjob/code"
"""Where the code is mounted in a worker (read-only), and the worker's working directory."""

LABEL_SUBMITTED: Final = "elasticjob.dev/submitted-by"
"""Label on what ``elasticjob submit`` created (the job and its code's ConfigMap)."""

_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class RequestError(ValueError):
    """The request cannot make a valid ElasticJob: the message names the option or field."""


@dataclass(frozen=True)
class WorkerRange:
    """How many worker pods: ``minimum`` to ``maximum``, starting with ``replicas``."""

    minimum: int
    maximum: int
    replicas: int

    @classmethod
    def parse(cls, text: str) -> WorkerRange:
        """``"4"`` (exactly 4) or ``"2:8"`` (2 to 8, starting with 8: the operator runs the
        job with as many as it can place, and at least 2)."""
        low, sep, high = text.partition(":")
        try:
            minimum, maximum = int(low), int(high if sep else low)
        except ValueError:
            raise RequestError(f"--workers: N or MIN:MAX, got {text!r}") from None
        if not 1 <= minimum <= maximum:
            raise RequestError(f"--workers: need 1 <= MIN <= MAX, got {text!r}")
        return cls(minimum, maximum, maximum)


@dataclass(frozen=True)
class JobRequest:
    """A job to submit: what runs, where, on how many workers."""

    name: str
    workers: WorkerRange = WorkerRange(1, 1, 1)
    args: tuple[str, ...] = ()
    """The script's arguments."""
    image: str = DEFAULT_IMAGE
    mode: JobMode = JobMode.ELASTIC
    gpus: int = 0
    """GPUs per worker pod: as many worker processes (``slotsPerWorker``), one per GPU."""
    env: Mapping[str, str] = field(default_factory=dict)
    cpu: str | None = None
    """The CPU each worker pod requests (e.g. ``"2"``, ``"500m"``)."""
    memory: str | None = None
    """The memory each worker pod requests and is limited to (e.g. ``"4Gi"``)."""


def default_name(script: str) -> str:
    """A new job name from the script's (``train.py`` -> ``train-3f9a``): unique enough that
    two submissions of one script do not collide."""
    stem = script.rsplit("/", 1)[-1].removesuffix(".py").lower()
    stem = _NAME_CHARS.sub("-", stem).strip("-")[:40] or "job"
    return f"{stem}-{secrets.token_hex(2)}"


def code_config_map_name(job: str) -> str:
    return f"{job}-code"


def job_manifest(request: JobRequest, bundle: CodeBundle) -> dict[str, Any]:
    """The ElasticJob: the worker image runs ``python <entry> <args>`` in the code's folder."""
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": request.image,
        "command": ["python", bundle.entry, *request.args],
        "workingDir": CODE_DIR,
        "volumeMounts": [{"name": "code", "mountPath": CODE_DIR, "readOnly": True}],
    }
    if request.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(request.env.items())]
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if request.cpu:
        requests["cpu"] = request.cpu
    if request.memory:
        requests["memory"] = limits["memory"] = request.memory
    if request.gpus:
        limits[GPU_RESOURCE] = request.gpus
    if requests or limits:
        container["resources"] = {
            k: v for k, v in (("requests", requests), ("limits", limits)) if v
        }
    code_volume = {
        "name": "code",
        "configMap": {
            "name": code_config_map_name(request.name),
            "items": bundle.volume_items(),
        },
    }
    workers = request.workers
    spec: dict[str, Any] = {
        "replicas": workers.replicas,
        "minReplicas": workers.minimum,
        "maxReplicas": workers.maximum,
        "mode": request.mode.value,
        "template": {"spec": {"containers": [container], "volumes": [code_volume]}},
    }
    if request.gpus:
        spec["slotsPerWorker"] = request.gpus
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": request.name, "labels": {LABEL_SUBMITTED: "elasticjob-submit"}},
        "spec": spec,
    }


def code_config_map(request: JobRequest, bundle: CodeBundle) -> dict[str, Any]:
    """The ConfigMap of the code (its owner, the job, is set once the job exists)."""
    data, binary = bundle.config_map_data()
    config_map: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": code_config_map_name(request.name),
            "labels": {LABEL_SUBMITTED: "elasticjob-submit"},
        },
        "data": data,
    }
    if binary:
        config_map["binaryData"] = binary
    return config_map


def check(job: Mapping[str, Any]) -> None:
    """Refuse, before sending it, a job the operator's admission would refuse (the same
    rules), naming the field."""
    name = job["metadata"]["name"]
    if not _DNS_NAME.fullmatch(name):
        raise RequestError(
            f"--name: lower-case letters, digits and '-', starting and ending with a letter "
            f"or digit, got {name!r}"
        )
    errors = [*name_errors(name), *validate(job["spec"])]
    if errors:
        raise RequestError("; ".join(f"{e.field}: {e.message}" for e in errors))
