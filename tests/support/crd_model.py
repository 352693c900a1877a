"""What the ElasticJob API tests share: the CRD and its schema, and a small model of what the
API server does with a structural schema (defaulting, pruning, validation)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elasticjob.operator.api.crd import DEFAULT_OUTPUT, build_crd

CRD_FILE = Path(__file__).resolve().parents[2] / DEFAULT_OUTPUT
VERSION = build_crd()["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT["properties"]["spec"]
STATUS_SCHEMA = ROOT["properties"]["status"]

# --- a small model of what the API server does with a structural schema -------------------

_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def schema_errors(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Where ``value`` breaks ``schema`` (types, enums, ranges, required and unknown fields)."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null"]
    kind = schema["type"]
    matches = isinstance(value, _TYPES[kind]) and (kind == "boolean") == isinstance(value, bool)
    if not matches:
        return [f"{path}: not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not in enum")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: below minimum")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: above maximum")
    if kind in ("string", "array") and len(value) < schema.get(
        "minLength", schema.get("minItems", 0)
    ):
        errors.append(f"{path}: too short")
    if kind == "array":
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{path}[{index}]")
    if kind == "object":
        errors += [
            f"{path}.{name}: required" for name in schema.get("required", ()) if name not in value
        ]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(properties[key], item, f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += schema_errors(schema["additionalProperties"], item, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field (pruned)")
    return errors


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with the schema's defaults applied, as the API server does."""
    if isinstance(value, dict) and "properties" in schema:
        result = dict(value)
        for name, sub in schema["properties"].items():
            if name not in result and "default" in sub:
                result[name] = copy.deepcopy(sub["default"])
            if name in result:
                result[name] = apply_defaults(sub, result[name])
        return result
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def schema_nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path, the root first."""
    yield path or ".", schema
    for name, sub in schema.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if "items" in schema:
        yield from schema_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_nodes(schema["additionalProperties"], f"{path}{{}}")


def good_spec() -> dict[str, Any]:
    return {
        "replicas": 3,
        "minReplicas": 2,
        "maxReplicas": 5,
        "template": {
            "spec": {"containers": [{"name": "worker", "image": "elasticjob-worker:dev"}]}
        },
    }


def with_changes(**changes: Any) -> dict[str, Any]:
    """``good_spec()`` with top-level keys replaced (a value of ``...`` removes the key)."""
    spec = good_spec()
    for key, value in changes.items():
        if value is ...:
            del spec[key]
        else:
            spec[key] = value
    return spec


def with_containers(*containers: dict[str, Any], slots: int = 1, **changes: Any) -> dict[str, Any]:
    """``good_spec()`` with these containers (each given an image when it has none), and
    ``changes``."""
    listed = [{"image": "img", **container} for container in containers]
    return with_changes(slotsPerWorker=slots, template={"spec": {"containers": listed}}, **changes)


def gpus(name: str, amount: object, kind: str = "limits") -> dict[str, Any]:
    return {"name": name, "command": ["train"], "resources": {kind: {"nvidia.com/gpu": amount}}}
