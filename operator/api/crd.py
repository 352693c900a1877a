"""The ElasticJob CustomResourceDefinition, generated from the pydantic models.

``python -m elasticjob.operator.api.crd`` (from the repository root) writes it to
``deploy/crds/elasticjob.dev_elasticjobs.yaml``; with ``--check`` it writes nothing and exits 1,
showing a diff, when that file is not what the models generate.

The models' JSON schemas are turned into the structural-schema subset that Kubernetes 1.20
accepts: ``$ref``s inlined, ``title``s dropped, ``X | None`` as ``nullable: true``, models that
keep unknown fields as ``x-kubernetes-preserve-unknown-fields``. Defaults stay in the spec
(the API server applies them) and are left out of the status, which only the operator writes.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from elasticjob.operator.api.models.job_status import ElasticJobStatus
from elasticjob.operator.api.models.spec import ElasticJobSpec
from elasticjob.operator.api.names import (
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)

DEFAULT_OUTPUT = Path("deploy/crds/elasticjob.dev_elasticjobs.yaml")
CHART_OUTPUT = Path("deploy/helm/elasticjob-operator/crds/elasticjob.dev_elasticjobs.yaml")
"""The chart's copy (Helm installs a chart's crds/ before anything else)."""
REGENERATE = "python -m elasticjob.operator.api.crd"

_HEADER = (
    "# Generated from the models in elasticjob.operator.api.models; do not edit by hand.\n"
    f"# Regenerate with `{REGENERATE}`.\n"
)
# JSON schema keywords that mean the same in a Kubernetes structural schema.
_KEPT = frozenset(
    {
        "enum",
        "format",
        "maxItems",
        "maxLength",
        "maximum",
        "minItems",
        "minLength",
        "minimum",
        "nullable",
        "pattern",
        "required",
        "type",
    }
)


def structural_schema(model: type[BaseModel], *, defaults: bool = True) -> dict[str, Any]:
    """``model``'s JSON schema (wire names) as a Kubernetes structural schema.

    Raises ValueError for a JSON schema construct that has no structural equivalent.
    """
    schema = model.model_json_schema(by_alias=True)
    definitions = schema.pop("$defs", {})
    return _convert(schema, definitions, defaults)


def _convert(
    node: Mapping[str, Any], definitions: Mapping[str, Any], defaults: bool
) -> dict[str, Any]:
    node = _inline(node, definitions)
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            result[key] = " ".join(value.split())
        elif key in _KEPT:
            result[key] = value
        elif key == "title":
            continue
        elif key == "default":
            if defaults and value is not None:
                result[key] = value
        elif key == "properties":
            result[key] = {
                name: _convert(sub, definitions, defaults) for name, sub in value.items()
            }
        elif key == "items":
            result[key] = _convert(value, definitions, defaults)
        elif key == "additionalProperties":
            if value is True:
                result["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                result[key] = _convert(value, definitions, defaults)
        else:
            raise ValueError(f"no structural-schema equivalent for JSON schema keyword {key!r}")
    return result


def _inline(node: Mapping[str, Any], definitions: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with its ``$ref``, single-member ``allOf`` and ``X | None`` ``anyOf`` resolved;
    keywords beside them (description, default) take precedence over the referenced ones."""
    if "$ref" in node:
        target = definitions[node["$ref"].removeprefix("#/$defs/")]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **rest}, definitions)
    if "allOf" in node and len(node["allOf"]) == 1:  # how pydantic < 2.9 writes a $ref
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _inline({**node["allOf"][0], **rest}, definitions)
    if "anyOf" in node:
        members = [m for m in node["anyOf"] if m != {"type": "null"}]
        if len(members) != 1 or len(members) == len(node["anyOf"]):
            raise ValueError(f"only `X | None` unions have a structural equivalent: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _inline({**members[0], **rest, "nullable": True}, definitions)
    return node


def build_crd() -> dict[str, Any]:
    """The ElasticJob CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    schema = {
        "type": "object",
        "description": "An elastic distributed PyTorch training job.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(ElasticJobSpec),
            "status": structural_schema(ElasticJobStatus, defaults=False),
        },
        "required": ["spec"],
    }
    columns = [
        ("Phase", "string", ".status.phase"),
        ("Current", "integer", ".status.replicas"),
        ("Desired", "integer", ".spec.replicas"),
        ("Min", "integer", ".spec.minReplicas"),
        ("Max", "integer", ".spec.maxReplicas"),
        ("Round", "integer", ".status.round"),
        ("Goodput", "number", ".status.goodput.ratio"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path}
                        for name, kind, path in columns
                    ],
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML text checked in under ``deploy/crds/``."""
    body: str = yaml.safe_dump(build_crd(), sort_keys=True, width=100)
    return _HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    """Write the CRD YAML (by default ``deploy/crds/`` and the chart's copy), or with
    ``--check`` report whether the written files are current."""
    parser = argparse.ArgumentParser(prog=REGENERATE, description="Generate the ElasticJob CRD.")
    parser.add_argument(
        "--output", type=Path, action="append", help="a YAML file (repeatable; default: both)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 with a diff when a file is not current"
    )
    args = parser.parse_args(argv)
    outputs: list[Path] = args.output or [DEFAULT_OUTPUT, CHART_OUTPUT]
    expected = render_crd()
    if not args.check:
        for output in outputs:
            output.write_text(expected)
            print(f"wrote {output}")
        return 0
    return max(_check(output, expected) for output in outputs)


def _check(output: Path, expected: str) -> int:
    if not output.exists():
        print(
            f"{output} does not exist (run from the repository root, or pass --output)",
            file=sys.stderr,
        )
        return 1
    current = output.read_text()
    if current == expected:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{output} (checked in)",
        tofile=f"{output} (generated)",
    )
    sys.stderr.writelines(diff)
    print(f"{output} is out of date; regenerate it with `{REGENERATE}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
