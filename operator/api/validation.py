"""Validation of an ElasticJob spec, as a pure function for the admission webhook and the
operator alike.

Besides the types, required fields and ranges that the models (and so the CRD schema)
express, a spec must satisfy these rules, which a Kubernetes 1.20 schema cannot express:

- ``minReplicas <= maxReplicas`` and ``minReplicas <= replicas <= maxReplicas``;
- ``blacklist.cooldownSeconds.min <= blacklist.cooldownSeconds.max``;
- container names in the template are unique, and the worker container is determined: the
  container named ``worker``, or the only container when there is exactly one;
- when the worker container asks for N >= 1 ``nvidia.com/gpu`` (in its limits, else in its
  requests), N is a whole number and ``slotsPerWorker <= N``: each process needs a GPU.
  Fewer slots than GPUs is allowed (a process may use several); no GPU asked, no rule.

- the pod template leaves the operator's part alone: no ``metadata`` name, generateName,
  namespace, finalizers or ownerReferences (the operator names and owns the pods), no label
  of the operator's own (``elasticjob.dev/...``), and no
  container sets a variable of the worker contract
  (``elasticjob.worker_contract.WORKER_CONTRACT_ENV``, any ``ELASTICJOB_*``) in ``env``, nor
  imports one through an ``envFrom`` prefix;
- every container has an image (a non-empty string);
- ``checkpoint`` (durable checkpoints): its ``volume`` is a volume of the pod template, its
  ``path`` is absolute and no other volume is mounted there in the worker container, and
  exactly one of ``everyCommits`` and ``intervalSeconds`` is given.

Apart from the spec, a job's name must fit a label value (:func:`name_errors`): it labels the
job's pods; a job is not run in the operator's own namespace (:func:`namespace_errors`); and
suspending a job that has trained, in elastic mode with no ``checkpoint`` policy, would lose
its training, so it needs ``allowSuspendWithoutCheckpoint: true`` (:func:`suspend_errors`).

Given the API server's Pod schema (:class:`~elasticjob.operator.api.podschema.PodSchema`), a
field of the pod template that a pod does not have (a typo such as ``resource:``) is an error
too.

Every error names its field by its path in the object, e.g. ``spec.minReplicas``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from elasticjob.driver.driver_types import JobMode
from elasticjob.operator.api.field_error import FieldError
from elasticjob.operator.api.models.spec import Container, ElasticJobSpec
from elasticjob.operator.api.names import GPU_RESOURCE, LABEL_JOB_NAME, WORKER_CONTAINER
from elasticjob.operator.api.template_rules import template_errors

if TYPE_CHECKING:
    from elasticjob.operator.api.podschema import PodSchema

_WHOLE_NUMBER = re.compile(r"[0-9]+")
LABEL_VALUE_MAX = 63
"""The longest label value Kubernetes accepts: the longest job name."""


class InvalidSpecError(ValueError):
    """A spec that breaks at least one rule; ``errors`` lists them all."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(str(error) for error in self.errors))


def parse_spec(spec: Mapping[str, Any], pod_schema: PodSchema | None = None) -> ElasticJobSpec:
    """The spec as a model; raises :class:`InvalidSpecError` when it breaks any rule (with
    ``pod_schema``, also when its pod template has fields a pod does not have)."""
    try:
        model = ElasticJobSpec.model_validate(spec)
    except ValidationError as exc:
        raise InvalidSpecError(
            [FieldError(_path(error["loc"]), error["msg"]) for error in exc.errors()]
        ) from None
    errors = [
        *_replica_errors(model),
        *_cooldown_errors(model),
        *_container_errors(model),
        *template_errors(spec["template"]),
        *_checkpoint_errors(model),
    ]
    if pod_schema is not None:
        errors.extend(pod_schema.unknown_fields(spec["template"]))
    if errors:
        raise InvalidSpecError(errors)
    return model


def validate(spec: Mapping[str, Any], pod_schema: PodSchema | None = None) -> list[FieldError]:
    """Every rule ``spec`` breaks; empty when it is valid."""
    try:
        parse_spec(spec, pod_schema)
    except InvalidSpecError as exc:
        return list(exc.errors)
    return []


def name_errors(name: str | None) -> list[FieldError]:
    """What is wrong with a job's name (None: the API server has yet to generate it)."""
    if name is not None and len(name) > LABEL_VALUE_MAX:
        return [
            FieldError(
                "metadata.name",
                f"must be at most {LABEL_VALUE_MAX} characters (it is the value of the label "
                f"{LABEL_JOB_NAME} on the job's pods), got {len(name)}",
            )
        ]
    return []


def namespace_errors(namespace: str | None, operator_namespace: str | None) -> list[FieldError]:
    """What is wrong with running a job in ``namespace`` under an operator in
    ``operator_namespace`` (None: not known): there, the job's pods would share the operator's
    service account, and its Role and Service would reach them."""
    if namespace is None or namespace != operator_namespace:
        return []
    return [
        FieldError(
            "metadata.namespace",
            f"{namespace} is the operator's own namespace, where it runs no job (its pods "
            "would share the operator's service account, Role and Service): create the job "
            "in another namespace",
        )
    ]


def suspend_errors(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """What is wrong with updating the job ``old`` (as stored; None: a create) to ``spec``
    as a suspension: a job that has trained (its status records a round), in elastic mode with
    no checkpoint policy, would resume from scratch; the user confirms that with
    ``allowSuspendWithoutCheckpoint``. A restart-mode script resumes from checkpoints of its
    own; a job that never trained loses nothing."""
    if old is None or spec.get("suspend") is not True:
        return []
    if (old.get("spec") or {}).get("suspend") is True or not (old.get("status") or {}).get("round"):
        return []
    confirmed = spec.get("allowSuspendWithoutCheckpoint") is True
    if spec.get("checkpoint") is not None or confirmed or spec.get("mode") == JobMode.RESTART:
        return []
    return [
        FieldError(
            "spec.suspend",
            "the job has trained and has no spec.checkpoint policy, so suspending it loses its "
            "training (it would start afresh when resumed): add spec.checkpoint, or set "
            "spec.allowSuspendWithoutCheckpoint: true to confirm",
        )
    ]


def validate_scale(spec: Mapping[str, Any], replicas: int) -> list[FieldError]:
    """What is wrong with scaling a job of ``spec`` to ``replicas`` (through its ``scale``
    subresource): the errors about ``spec.replicas``, e.g. that it exceeds maxReplicas."""
    return [e for e in validate({**spec, "replicas": replicas}) if e.field == "spec.replicas"]


def _path(loc: tuple[int | str, ...]) -> str:
    return "spec" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _replica_errors(spec: ElasticJobSpec) -> list[FieldError]:
    low, high = spec.min_replicas, spec.max_replicas
    if low > high:
        return [FieldError("spec.minReplicas", f"must be <= spec.maxReplicas ({high}), got {low}")]
    if spec.replicas < low:
        return [
            FieldError("spec.replicas", f"must be >= spec.minReplicas ({low}), got {spec.replicas}")
        ]
    if spec.replicas > high:
        return [
            FieldError(
                "spec.replicas", f"must be <= spec.maxReplicas ({high}), got {spec.replicas}"
            )
        ]
    return []


def _cooldown_errors(spec: ElasticJobSpec) -> list[FieldError]:
    cooldown = spec.blacklist.cooldown_seconds
    if cooldown.min > cooldown.max:
        return [
            FieldError(
                "spec.blacklist.cooldownSeconds.min",
                f"must be <= spec.blacklist.cooldownSeconds.max ({cooldown.max}), "
                f"got {cooldown.min}",
            )
        ]
    return []


def _checkpoint_errors(spec: ElasticJobSpec) -> list[FieldError]:
    checkpoint = spec.checkpoint
    if checkpoint is None:
        return []
    errors = []
    if (checkpoint.every_commits is None) == (checkpoint.interval_seconds is None):
        errors.append(
            FieldError(
                "spec.checkpoint",
                "give exactly one of everyCommits and intervalSeconds (how often rank 0 "
                "writes a checkpoint)",
            )
        )
    pod_spec = spec.template.spec.model_extra or {}
    volumes = pod_spec.get("volumes") or []
    names = [v.get("name") for v in volumes if isinstance(v, Mapping)]
    if checkpoint.volume not in names:
        errors.append(
            FieldError(
                "spec.checkpoint.volume",
                f"{checkpoint.volume!r} is not a volume of the pod template "
                f"(spec.template.spec.volumes: {', '.join(map(str, names)) or 'none'})",
            )
        )
    path = checkpoint.path
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or path == "/":
        errors.append(
            FieldError(
                "spec.checkpoint.path",
                f"must be an absolute, normalised folder path other than /, got {path!r}",
            )
        )
    worker = spec.template.spec.worker_container()
    mounts = (worker.model_extra or {}).get("volumeMounts") or [] if worker else []
    for mount in mounts if isinstance(mounts, Sequence) else []:
        if (
            isinstance(mount, Mapping)
            and mount.get("mountPath", "").rstrip("/") == path.rstrip("/")
            and mount.get("name") != checkpoint.volume
        ):
            errors.append(
                FieldError(
                    "spec.checkpoint.path",
                    f"the worker container mounts the volume {mount.get('name')!r} at "
                    f"{path!r}, not {checkpoint.volume!r}",
                )
            )
    return errors


def _container_errors(spec: ElasticJobSpec) -> list[FieldError]:
    containers = spec.template.spec.containers
    field = "spec.template.spec.containers"
    errors = [
        FieldError(f"{field}[{index}].name", f"duplicate container name {container.name!r}")
        for index, container in enumerate(containers)
        if container.name in {c.name for c in containers[:index]}
    ]
    worker = spec.template.spec.worker_container()
    if worker is None:
        errors.append(
            FieldError(
                field,
                f"with {len(containers)} containers, one must be named {WORKER_CONTAINER!r} "
                "(the container the worker runtime runs in)",
            )
        )
    elif not errors:
        where = f"{field}[{containers.index(worker)}]"
        errors.extend(_gpu_errors(spec, worker, where))
        if spec.slots_per_worker > 1 and not (worker.model_extra or {}).get("command"):
            errors.append(
                FieldError(
                    f"{where}.command",
                    "is required when slotsPerWorker > 1: the pod runs it once per slot",
                )
            )
        elif spec.mode is JobMode.RESTART and not (worker.model_extra or {}).get("command"):
            errors.append(
                FieldError(
                    f"{where}.command",
                    "is required when mode is restart: the pod's agent runs it, and again at "
                    "each change of the job",
                )
            )
        elif spec.health_check is not None and not (worker.model_extra or {}).get("command"):
            errors.append(
                FieldError(
                    f"{where}.command",
                    "is required with healthCheck: the pod's check runs it once the pod passed "
                    "(the image's entrypoint is not run)",
                )
            )
    return errors


def _gpu_errors(spec: ElasticJobSpec, worker: Container, field: str) -> list[FieldError]:
    resources = (worker.model_extra or {}).get("resources")
    if not isinstance(resources, Mapping):
        return []
    for kind in ("limits", "requests"):
        amounts = resources.get(kind)
        if isinstance(amounts, Mapping) and GPU_RESOURCE in amounts:
            gpus = _whole_number(amounts[GPU_RESOURCE])
            path = f"{field}.resources.{kind}.{GPU_RESOURCE}"
            if gpus is None:
                return [
                    FieldError(
                        path, f"must be a whole number of GPUs, got {amounts[GPU_RESOURCE]!r}"
                    )
                ]
            if 1 <= gpus < spec.slots_per_worker:
                return [
                    FieldError(
                        "spec.slotsPerWorker",
                        f"must be <= the {gpus} GPUs the worker container asks for "
                        f"({path}), got {spec.slots_per_worker}",
                    )
                ]
            return []
    return []


def _whole_number(amount: object) -> int | None:
    if isinstance(amount, bool):
        return None
    if isinstance(amount, int):
        return amount if amount >= 0 else None
    if isinstance(amount, str) and _WHOLE_NUMBER.fullmatch(amount):
        return int(amount)
    return None
