"""The rules of an ElasticJob's pod template that leave the operator's part alone (see
``validation.py``, which applies them): no ``metadata`` that the operator sets itself, no
label of its own, an image in every container, and no variable of the worker contract set
or imported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elasticjob.operator.api.field_error import FieldError
from elasticjob.operator.api.names import GROUP
from elasticjob.worker_contract import (
    WORKER_CONTRACT_ENV,
    WORKER_ENV_PREFIX,
    is_worker_contract_env,
)

OPERATOR_METADATA = ("name", "generateName", "namespace", "finalizers", "ownerReferences")
"""Template metadata fields the operator sets on every worker pod itself."""
_CONTAINER_LISTS = ("containers", "initContainers")


def template_errors(template: Mapping[str, Any]) -> list[FieldError]:
    """The operator's part of the pod template that the template sets, and missing images."""
    metadata = template.get("metadata") or {}
    errors = [
        FieldError(
            f"spec.template.metadata.{key}",
            "must not be set: the operator names and owns the worker pods",
        )
        for key in OPERATOR_METADATA
        if key in metadata
    ]
    labels = metadata.get("labels") or {}
    errors.extend(
        FieldError(
            f"spec.template.metadata.labels[{key}]",
            f"{GROUP}/ labels are the operator's own: it sets them on the worker pods",
        )
        for key in (labels if isinstance(labels, Mapping) else {})
        if str(key).split("/", 1)[0] == GROUP
    )
    pod_spec = template["spec"]
    for kind in _CONTAINER_LISTS:
        containers = pod_spec.get(kind) or []
        if not isinstance(containers, Sequence):
            continue
        for index, container in enumerate(containers):
            if isinstance(container, Mapping):
                where = f"spec.template.spec.{kind}[{index}]"
                errors.extend(_image_errors(container, where))
                errors.extend(_env_errors(container, where))
    return errors


def _image_errors(container: Mapping[str, Any], where: str) -> list[FieldError]:
    image = container.get("image")
    if isinstance(image, str) and image.strip():
        return []
    return [FieldError(f"{where}.image", f"must be a container image name, got {image!r}")]


def _env_errors(container: Mapping[str, Any], where: str) -> list[FieldError]:
    errors = []
    env = container.get("env") or []
    for index, variable in enumerate(env if isinstance(env, Sequence) else []):
        name = variable.get("name") if isinstance(variable, Mapping) else None
        if isinstance(name, str) and is_worker_contract_env(name):
            errors.append(
                FieldError(
                    f"{where}.env[{index}].name",
                    f"{name} is a variable of the worker contract, which the operator sets "
                    f"(every {WORKER_ENV_PREFIX}* name is reserved)",
                )
            )
    sources = container.get("envFrom") or []
    for index, source in enumerate(sources if isinstance(sources, Sequence) else []):
        prefix = source.get("prefix") if isinstance(source, Mapping) else None
        if isinstance(prefix, str) and prefix and _may_import_contract(prefix):
            errors.append(
                FieldError(
                    f"{where}.envFrom[{index}].prefix",
                    f"{prefix!r} could import a variable of the worker contract, which the "
                    f"operator sets (every {WORKER_ENV_PREFIX}* name is reserved)",
                )
            )
    return errors


def _may_import_contract(prefix: str) -> bool:
    """Whether keys under ``prefix`` can make a name of the worker contract."""
    names = (*WORKER_CONTRACT_ENV, WORKER_ENV_PREFIX)
    return is_worker_contract_env(prefix) or any(n.startswith(prefix) for n in names)
