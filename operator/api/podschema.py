"""Unknown fields in a pod template, found with the Pod schema the API server publishes.

The ElasticJob CRD keeps its pod template as it is given (a Kubernetes 1.20 CRD schema cannot
refer to the Pod schema), and an API server of that age drops unknown fields of a pod silently:
``resource:`` instead of ``resources:`` in a container would vanish from every worker pod.
So the template is checked against the definitions of the API server's OpenAPI v2 document
(``/openapi/v2``): a field that is not in its object's definition, at any depth, is an error
naming its path, e.g. ``spec.template.spec.containers[0].resource``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob.operator.api.field_error import FieldError

POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
"""The definition a pod template is checked against."""

_REF_PREFIX = "#/definitions/"


@dataclass(frozen=True)
class PodSchema:
    """The definitions a pod template may use (those reachable from :data:`POD_TEMPLATE`)."""

    definitions: Mapping[str, Mapping[str, Any]]

    @classmethod
    def from_openapi(cls, document: Mapping[str, Any]) -> PodSchema:
        """The pod template's definitions out of an OpenAPI v2 document; raises
        :class:`ValueError` when the document does not define a pod template."""
        everything: Mapping[str, Mapping[str, Any]] = document.get("definitions") or {}
        if POD_TEMPLATE not in everything:
            raise ValueError(f"the OpenAPI document does not define {POD_TEMPLATE}")
        kept: dict[str, Mapping[str, Any]] = {}
        todo = [POD_TEMPLATE]
        while todo:
            name = todo.pop()
            if name in kept or name not in everything:
                continue
            kept[name] = everything[name]
            todo.extend(_references(kept[name]))
        return cls(kept)

    def unknown_fields(self, template: object, path: str = "spec.template") -> list[FieldError]:
        """Every field of ``template`` (at ``path``) that its definition does not have."""
        errors: list[FieldError] = []
        self._check({"$ref": _REF_PREFIX + POD_TEMPLATE}, template, path, errors)
        return errors

    def _check(
        self, schema: Mapping[str, Any], value: object, path: str, errors: list[FieldError]
    ) -> None:
        ref = schema.get("$ref")
        name = ref.removeprefix(_REF_PREFIX) if isinstance(ref, str) else None
        if name is not None:
            schema = self.definitions.get(name, {})
        if isinstance(value, Mapping):
            properties = schema.get("properties")
            values = schema.get("additionalProperties")
            if isinstance(properties, Mapping):
                for key, item in value.items():
                    if key in properties:
                        self._check(properties[key], item, f"{path}.{key}", errors)
                    else:
                        kind = (name or "object").rsplit(".", 1)[-1]
                        errors.append(FieldError(f"{path}.{key}", f"{kind} has no field {key!r}"))
            elif isinstance(values, Mapping):
                for key, item in value.items():
                    self._check(values, item, f"{path}.{key}", errors)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for index, item in enumerate(value):
                self._check(schema["items"], item, f"{path}[{index}]", errors)


def _references(schema: object) -> list[str]:
    """The definitions ``schema`` refers to, at any depth."""
    if isinstance(schema, Mapping):
        found = [
            ref.removeprefix(_REF_PREFIX)
            for key, ref in schema.items()
            if key == "$ref" and isinstance(ref, str)
        ]
        for key, item in schema.items():
            if key != "$ref":
                found.extend(_references(item))
        return found
    if isinstance(schema, list):
        return [ref for item in schema for ref in _references(item)]
    return []
