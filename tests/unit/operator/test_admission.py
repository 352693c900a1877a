"""Admission rules beyond the spec's own: the scale subresource's replicas against the stored
job's bounds, a suspension that would lose a trained job's work, and pod template fields
checked against the API server's Pod schema (here a small OpenAPI v2 document of the same
shape)."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.operator.api import FieldError, InvalidSpecError, parse_spec, validate
from elasticjob.operator.api.podschema import POD_TEMPLATE, PodSchema
from elasticjob.operator.api.validation import suspend_errors, validate_scale
from tests.support.crd_model import good_spec, with_changes

# --- suspension ------------------------------------------------------------------------------

CHECKPOINT = {"volume": "ckpt", "path": "/ckpt", "everyCommits": 10}
TRAINED = {"spec": good_spec(), "status": {"round": 3, "phase": "Running"}}
NOT_CONFIRMED = [
    FieldError(
        "spec.suspend",
        "the job has trained and has no spec.checkpoint policy, so suspending it loses its "
        "training (it would start afresh when resumed): add spec.checkpoint, or set "
        "spec.allowSuspendWithoutCheckpoint: true to confirm",
    )
]


@pytest.mark.parametrize(
    ("spec", "old", "expected"),
    [
        pytest.param(with_changes(suspend=True), TRAINED, NOT_CONFIRMED, id="trained-unsaved"),
        pytest.param(with_changes(suspend=True, checkpoint=CHECKPOINT), TRAINED, [],
                     id="with-a-checkpoint-policy"),
        pytest.param(with_changes(suspend=True, allowSuspendWithoutCheckpoint=True), TRAINED,
                     [], id="confirmed"),
        pytest.param(with_changes(suspend=True, mode="restart"), TRAINED, [],
                     id="restart-mode-checkpoints-itself"),
        pytest.param(with_changes(suspend=True), {"spec": good_spec(), "status": {}}, [],
                     id="never-trained"),
        pytest.param(with_changes(suspend=True), None, [], id="created-suspended"),
        pytest.param(with_changes(suspend=True, replicas=4),
                     {"spec": with_changes(suspend=True), "status": {"round": 3}}, [],
                     id="already-suspended"),
        pytest.param(with_changes(suspend=False), TRAINED, [], id="not-a-suspension"),
    ],
)  # fmt: skip
def test_a_suspension_that_loses_training_needs_confirmation(
    spec: dict[str, Any], old: dict[str, Any] | None, expected: list[FieldError]
) -> None:
    assert suspend_errors(spec, old) == expected


# --- the scale subresource -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param(2, [], id="at-min"),
        pytest.param(5, [], id="at-max"),
        pytest.param(
            6, [FieldError("spec.replicas", "must be <= spec.maxReplicas (5), got 6")], id="above"
        ),
        pytest.param(
            1, [FieldError("spec.replicas", "must be >= spec.minReplicas (2), got 1")], id="below"
        ),
    ],
)
def test_scale_is_checked_against_the_stored_bounds(
    replicas: int, expected: list[FieldError]
) -> None:
    spec = with_changes(replicas=3, minReplicas=2, maxReplicas=5)
    assert validate_scale(spec, replicas) == expected


def test_scale_reports_only_the_replicas() -> None:
    broken = with_changes(replicas=3, minReplicas=2, maxReplicas=5, slotsPerWorker=2)
    assert validate(broken), "the stored spec breaks another rule"
    assert validate_scale(broken, 4) == []


# --- the pod schema ----------------------------------------------------------------------------


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/io.k8s.api.core.v1.{name}"}


DOCUMENT: dict[str, Any] = {
    "swagger": "2.0",
    "definitions": {
        POD_TEMPLATE: {
            "properties": {
                "metadata": {
                    "$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
                },
                "spec": ref("PodSpec"),
            }
        },
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
            "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "name": {"type": "string"},
            }
        },
        "io.k8s.api.core.v1.PodSpec": {
            "properties": {
                "containers": {"type": "array", "items": ref("Container")},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "terminationGracePeriodSeconds": {"type": "integer"},
            }
        },
        "io.k8s.api.core.v1.Container": {
            "properties": {
                "name": {"type": "string"},
                "image": {"type": "string"},
                "command": {"type": "array", "items": {"type": "string"}},
                "resources": ref("ResourceRequirements"),
                "env": {"type": "array", "items": ref("EnvVar")},
            }
        },
        "io.k8s.api.core.v1.ResourceRequirements": {
            "properties": {
                "limits": {
                    "type": "object",
                    "additionalProperties": {
                        "$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"
                    },
                },
            }
        },
        "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
        "io.k8s.api.core.v1.EnvVar": {
            "properties": {"name": {"type": "string"}, "value": {"type": "string"}}
        },
        "io.k8s.api.apps.v1.Deployment": {"properties": {"spec": {"type": "object"}}},
    },
}
SCHEMA = PodSchema.from_openapi(DOCUMENT)
CONTAINER = "spec.template.spec.containers"


def template(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {"pool": "gpu"},
            "containers": [{"name": "worker", "image": "w", "command": ["python"], **container}],
        },
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(template(), [], id="known-fields"),
        pytest.param(
            template(resources={"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}),
            [],
            id="map-of-quantities",
        ),
        pytest.param(
            template(resource={"limits": {"cpu": "1"}}),
            [FieldError(f"{CONTAINER}[0].resource", "Container has no field 'resource'")],
            id="resource-typo",
        ),
        pytest.param(
            template(env=[{"name": "A", "value": "1"}, {"name": "B", "valeu": "2"}]),
            [FieldError(f"{CONTAINER}[0].env[1].valeu", "EnvVar has no field 'valeu'")],
            id="deep-in-a-list",
        ),
        pytest.param(
            template(resources={"limit": {"cpu": "1"}}),
            [
                FieldError(
                    f"{CONTAINER}[0].resources.limit", "ResourceRequirements has no field 'limit'"
                )
            ],
            id="deep-in-an-object",
        ),
        pytest.param(
            {"metadata": {"lables": {}}, "spec": {"containers": [], "nodeSelectors": {}}},
            [
                FieldError("spec.template.metadata.lables", "ObjectMeta has no field 'lables'"),
                FieldError(
                    "spec.template.spec.nodeSelectors", "PodSpec has no field 'nodeSelectors'"
                ),
            ],
            id="every-unknown-field",
        ),
    ],
)
def test_unknown_template_fields_are_named_by_path(
    value: dict[str, Any], expected: list[FieldError]
) -> None:
    assert SCHEMA.unknown_fields(value) == expected


def test_only_the_pod_templates_definitions_are_kept() -> None:
    assert "io.k8s.api.apps.v1.Deployment" not in SCHEMA.definitions
    assert "io.k8s.api.core.v1.EnvVar" in SCHEMA.definitions


def test_a_document_without_a_pod_template_is_refused() -> None:
    with pytest.raises(ValueError, match=POD_TEMPLATE):
        PodSchema.from_openapi({"definitions": {}})


def test_a_typo_makes_the_spec_invalid_when_the_schema_is_known() -> None:
    spec = good_spec()
    spec["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    assert parse_spec(spec), "without the schema the typo passes"
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec, SCHEMA)
    assert str(caught.value) == f"{CONTAINER}[0].resource: Container has no field 'resource'"
    assert validate(spec, SCHEMA) == list(caught.value.errors)
