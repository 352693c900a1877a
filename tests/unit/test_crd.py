"""The ElasticJob API: the generated CRD, its schema, and validate()."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import BaseModel

from elasticjob.operator.api import (
    ConditionStatus,
    ConditionType,
    ElasticJobSpec,
    ElasticJobStatus,
    FieldError,
    InvalidSpecError,
    Phase,
    parse_spec,
    validate,
    worker_selector,
)
from elasticjob.operator.api.crd import (
    DEFAULT_OUTPUT,
    REGENERATE,
    build_crd,
    main,
    render_crd,
    structural_schema,
)

CRD_FILE = Path(__file__).resolve().parents[2] / DEFAULT_OUTPUT
VERSION = build_crd()["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT["properties"]["spec"]
STATUS_SCHEMA = ROOT["properties"]["status"]

# --- helpers: a small model of what the API server does with a structural schema ----------

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


def with_containers(*containers: dict[str, Any], slots: int = 1) -> dict[str, Any]:
    return with_changes(slotsPerWorker=slots, template={"spec": {"containers": list(containers)}})


def gpus(name: str, amount: object, kind: str = "limits") -> dict[str, Any]:
    return {"name": name, "command": ["train"], "resources": {kind: {"nvidia.com/gpu": amount}}}


# --- the generated CRD ----------------------------------------------------------------------


def test_checked_in_crd_is_generated_from_the_models() -> None:
    assert CRD_FILE.read_text() == render_crd(), (
        f"{DEFAULT_OUTPUT} is out of date: regenerate it with `{REGENERATE}`"
    )
    assert yaml.safe_load(CRD_FILE.read_text()) == build_crd()


def test_names_and_scope() -> None:
    crd = build_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "elasticjobs.elasticjob.dev"
    spec = crd["spec"]
    assert spec["group"] == "elasticjob.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "ElasticJob",
        "listKind": "ElasticJobList",
        "plural": "elasticjobs",
        "singular": "elasticjob",
        "shortNames": ["ej"],
        "categories": ["all"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [
        ("v1alpha1", True, True)
    ]


def test_subresources_and_printer_columns() -> None:
    assert VERSION["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ("string", ".status.phase"),
        "Current": ("integer", ".status.replicas"),
        "Desired": ("integer", ".spec.replicas"),
        "Min": ("integer", ".spec.minReplicas"),
        "Max": ("integer", ".spec.maxReplicas"),
        "Round": ("integer", ".status.round"),
        "Age": ("date", ".metadata.creationTimestamp"),
    }
    # Every column's path exists in the schema.
    for _, path in columns.values():
        top, *rest = path.strip(".").split(".")
        if top != "metadata":
            node = ROOT["properties"][top]
            for name in rest:
                node = node["properties"][name]


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "title", "const"}
    for path, node in schema_nodes(ROOT):
        assert "type" in node, f"{path} has no type"
        assert not forbidden & node.keys(), f"{path} uses {forbidden & node.keys()}"
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        for name in node.get("required", ()):
            assert name in node["properties"], f"{path} requires unknown {name}"
    assert ROOT["properties"]["metadata"] == {"type": "object"}


def test_pod_template_keeps_unknown_fields_at_every_level() -> None:
    template = SPEC_SCHEMA["properties"]["template"]
    objects = [
        (path, node)
        for path, node in schema_nodes(template, ".spec.template")
        if node["type"] == "object" and "additionalProperties" not in node
    ]
    assert [path for path, _ in objects] == [
        ".spec.template",
        ".spec.template.metadata",
        ".spec.template.spec",
        ".spec.template.spec.containers[]",
    ]
    for path, node in objects:
        assert node.get("x-kubernetes-preserve-unknown-fields") is True, path
    assert template["required"] == ["spec"]
    assert template["properties"]["spec"]["required"] == ["containers"]
    containers = template["properties"]["spec"]["properties"]["containers"]
    assert containers["type"] == "array"
    assert containers["items"]["required"] == ["name"]
    # Everything else in a pod template survives the API server's pruning.
    pod = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}, "finalizers": ["x"]},
        "spec": {
            "schedulerName": "volcano",
            "priorityClassName": "high",
            "nodeSelector": {"pool": "gpu"},
            "containers": [{"name": "worker", "image": "i", "resources": {"limits": {"cpu": 1}}}],
        },
    }
    assert schema_errors(template, pod, "spec.template") == []


def test_spec_schema_bounds_and_defaults() -> None:
    props = SPEC_SCHEMA["properties"]
    assert SPEC_SCHEMA["required"] == ["replicas", "maxReplicas", "template"]
    assert (props["minReplicas"]["minimum"], props["minReplicas"]["default"]) == (1, 1)
    assert (props["slotsPerWorker"]["minimum"], props["slotsPerWorker"]["maximum"]) == (1, 64)
    assert props["backend"]["enum"] == ["gloo", "nccl", "auto"]
    assert props["cleanPodPolicy"]["enum"] == ["All", "Running", "None"]
    assert props["elasticTimeoutSeconds"]["maximum"] == 86400
    assert props["resetLimit"]["nullable"] is True
    assert "default" not in props["resetLimit"]
    minimal = good_spec()
    assert apply_defaults(SPEC_SCHEMA, minimal) == ElasticJobSpec.model_validate(
        minimal
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert apply_defaults(SPEC_SCHEMA, minimal)["blacklist"] == {
        "cooldownSeconds": {"min": 10, "max": 300},
        "scope": "Node",
    }


def test_status_schema_has_no_defaults_and_takes_what_the_operator_writes() -> None:
    assert all("default" not in node for _, node in schema_nodes(STATUS_SCHEMA))
    assert STATUS_SCHEMA["properties"]["conditions"]["items"]["properties"]["type"]["enum"] == [
        t.value for t in ConditionType
    ]
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = ElasticJobStatus(
        phase=Phase.DEGRADED,
        conditions=[
            {
                "type": ConditionType.DEGRADED,
                "status": ConditionStatus.TRUE,
                "reason": "PodFailed",
                "message": "2 of 3 worker pods live",
                "last_transition_time": now,
            }
        ],
        replicas=2,
        selector=worker_selector("train"),
        round=4,
        world_size=4,
        workers=[{"pod": "train-worker-0", "node": "n1", "ranks": [0, 1]}],
        blacklisted_nodes=[{"node": "n2", "until": now}],
        reset_count=1,
        last_reset_reason="pod train-worker-2 failed",
        start_time=now,
        progress={"epoch": 1, "step": 20, "samples_per_second": 310.5},
    )
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert schema_errors(STATUS_SCHEMA, wire, "status") == []
    assert wire["selector"] == "elasticjob.dev/job-name=train,elasticjob.dev/role=worker"
    assert wire["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"
    assert wire["progress"]["samplesPerSecond"] == 310.5
    assert ElasticJobStatus.model_validate(wire) == status


class _Unsupported(BaseModel):
    either: int | str


def test_constructs_without_a_structural_equivalent_are_refused() -> None:
    with pytest.raises(ValueError, match="unions have a structural equivalent"):
        structural_schema(_Unsupported)


def test_main_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "crd.yaml"
    assert main(["--check", "--output", str(output)]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["--output", str(output)]) == 0
    assert output.read_text() == render_crd()
    assert main(["--check", "--output", str(output)]) == 0
    output.write_text(render_crd().replace("minimum: 1\n", "minimum: 2\n", 1))
    capsys.readouterr()
    assert main(["--check", "--output", str(output)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("-") and line.endswith("minimum: 2") for line in lines)
    assert any(line.startswith("+") and line.endswith("minimum: 1") for line in lines)
    assert lines[-1] == f"{output} is out of date; regenerate it with `{REGENERATE}`"
    assert main(["--check", "--output", str(CRD_FILE)]) == 0


# --- validate() -------------------------------------------------------------------------------

NVIDIA = "spec.template.spec.containers[0].resources"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(good_spec(), [], id="good"),
        pytest.param(
            with_changes(
                slotsPerWorker=2,
                backend="nccl",
                resetLimit=3,
                elasticTimeoutSeconds=120,
                blacklist={"cooldownSeconds": {"min": 5, "max": 5}, "scope": "Pod"},
                cleanPodPolicy="All",
                template={
                    "metadata": {"labels": {"team": "ml"}},
                    "spec": {
                        "schedulerName": "volcano",
                        "priorityClassName": "high",
                        "containers": [gpus("worker", 2) | {"image": "w"}, {"name": "sidecar"}],
                    },
                },
            ),
            [],
            id="good-every-field",
        ),
        pytest.param(
            with_changes(minReplicas=..., replicas=1, maxReplicas=1), [], id="min-default"
        ),
        pytest.param(
            with_changes(minReplicas=4, maxReplicas=3, replicas=3),
            [("spec.minReplicas", "must be <= spec.maxReplicas (3), got 4")],
            id="min-above-max",
        ),
        pytest.param(
            with_changes(replicas=1),
            [("spec.replicas", "must be >= spec.minReplicas (2), got 1")],
            id="replicas-below-min",
        ),
        pytest.param(
            with_changes(replicas=6),
            [("spec.replicas", "must be <= spec.maxReplicas (5), got 6")],
            id="replicas-above-max",
        ),
        pytest.param(
            with_changes(replicas=0),
            [("spec.replicas", "greater than or equal to 1")],
            id="replicas-zero",
        ),
        pytest.param(
            with_changes(maxReplicas=...), [("spec.maxReplicas", "required")], id="no-max"
        ),
        pytest.param(
            with_containers(),
            [("spec.template.spec.containers", "at least 1 item")],
            id="no-containers",
        ),
        pytest.param(
            with_changes(template={"spec": {}}),
            [("spec.template.spec.containers", "required")],
            id="containers-missing",
        ),
        pytest.param(with_changes(template=...), [("spec.template", "required")], id="no-template"),
        pytest.param(with_containers({"name": "trainer"}), [], id="single-container-of-any-name"),
        pytest.param(
            with_containers({"name": "trainer"}, {"name": "sidecar"}),
            [("spec.template.spec.containers", "one must be named 'worker'")],
            id="no-worker-container",
        ),
        pytest.param(
            with_containers({"name": "worker"}, {"name": "worker"}),
            [("spec.template.spec.containers[1].name", "duplicate container name 'worker'")],
            id="duplicate-names",
        ),
        pytest.param(
            with_containers({"image": "x"}),
            [("spec.template.spec.containers[0].name", "required")],
            id="container-without-name",
        ),
        pytest.param(
            with_containers(gpus("worker", 2), slots=4),
            [
                (
                    "spec.slotsPerWorker",
                    "must be <= the 2 GPUs the worker container asks for "
                    f"({NVIDIA}.limits.nvidia.com/gpu), got 4",
                )
            ],
            id="more-slots-than-gpus",
        ),
        pytest.param(with_containers(gpus("worker", "2"), slots=2), [], id="slots-equal-gpus"),
        pytest.param(with_containers(gpus("worker", 4), slots=2), [], id="fewer-slots-than-gpus"),
        pytest.param(
            with_containers(gpus("worker", 1, "requests"), slots=2),
            [("spec.slotsPerWorker", "requests.nvidia.com/gpu")],
            id="gpus-in-requests",
        ),
        pytest.param(
            with_containers(gpus("worker", "1.5")),
            [(f"{NVIDIA}.limits.nvidia.com/gpu", "must be a whole number of GPUs, got '1.5'")],
            id="gpus-not-whole",
        ),
        pytest.param(with_containers(gpus("worker", 0), slots=2), [], id="zero-gpus-no-rule"),
        pytest.param(
            with_containers({"name": "worker", "command": ["train"]}, gpus("sidecar", 1), slots=2),
            [],
            id="sidecar-gpus-ignored",
        ),
        pytest.param(
            with_containers({"name": "worker"}, slots=2),
            [(f"{NVIDIA.rsplit('.', 1)[0]}.command", "is required when slotsPerWorker > 1")],
            id="slots-need-a-command",
        ),
        pytest.param(
            with_changes(replicas="3"), [("spec.replicas", "valid integer")], id="replicas-string"
        ),
        pytest.param(
            with_changes(replicas=True), [("spec.replicas", "valid integer")], id="replicas-bool"
        ),
        pytest.param(
            with_changes(replicas=3.0), [("spec.replicas", "valid integer")], id="replicas-float"
        ),
        pytest.param(
            with_changes(backend="mpi"),
            [("spec.backend", "'gloo', 'nccl' or 'auto'")],
            id="backend-enum",
        ),
        pytest.param(
            with_changes(slotsPerWorker=65),
            [("spec.slotsPerWorker", "less than or equal to 64")],
            id="slots-too-many",
        ),
        pytest.param(
            with_changes(elasticTimeoutSeconds=0),
            [("spec.elasticTimeoutSeconds", "greater than or equal to 1")],
            id="timeout-zero",
        ),
        pytest.param(
            with_changes(resetLimit=-1),
            [("spec.resetLimit", "greater than or equal to 0")],
            id="reset-limit-negative",
        ),
        pytest.param(
            with_changes(blacklist={"scope": "Cluster"}),
            [("spec.blacklist.scope", "'Node' or 'Pod'")],
            id="scope-enum",
        ),
        pytest.param(
            with_changes(blacklist={"cooldownSeconds": {"min": 600}}),
            [
                (
                    "spec.blacklist.cooldownSeconds.min",
                    "must be <= spec.blacklist.cooldownSeconds.max (300), got 600",
                )
            ],
            id="cooldown-min-above-max",
        ),
        pytest.param(
            with_changes(blacklist={"cooldownSeconds": {"max": 0}}),
            [("spec.blacklist.cooldownSeconds.max", "greater than or equal to 1")],
            id="cooldown-zero",
        ),
        pytest.param(
            with_changes(cleanPodPolicy="Finished"),
            [("spec.cleanPodPolicy", "'All', 'Running' or 'None'")],
            id="clean-pod-policy-enum",
        ),
        pytest.param(
            with_changes(replica=3), [("spec.replica", "Extra inputs")], id="unknown-field"
        ),
        pytest.param(
            with_changes(min_replicas=2), [("spec.min_replicas", "Extra inputs")], id="snake-case"
        ),
        pytest.param(
            with_changes(template=[]), [("spec.template", "valid dictionary")], id="template-list"
        ),
        pytest.param(
            with_changes(replicas="x", backend="mpi"),
            [("spec.replicas", "valid integer"), ("spec.backend", "'gloo'")],
            id="every-error-reported",
        ),
    ],
)
def test_validate(spec: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    errors = validate(spec)
    assert [e.field for e in errors] == [field for field, _ in expected], errors
    for error, (field, fragment) in zip(errors, expected, strict=True):
        assert fragment in error.message, error
        assert str(error) == f"{field}: {error.message}"


def test_parse_spec() -> None:
    spec = parse_spec(good_spec())
    assert (spec.replicas, spec.min_replicas, spec.max_replicas) == (3, 2, 5)
    worker = spec.template.spec.worker_container()
    assert worker is not None and worker.name == "worker"
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(with_changes(minReplicas=9, backend="mpi"))
    assert [e.field for e in caught.value.errors] == ["spec.backend"]
    assert str(caught.value).startswith("spec.backend: ")
    assert caught.value.errors == (FieldError("spec.backend", caught.value.errors[0].message),)


# --- properties ------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)
SHORT_TEXT = st.text(max_size=4)


def either(valid: bool, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """``good`` values only, or a mix of good and bad ones."""
    return good if valid else good | bad


@st.composite
def containers(draw: st.DrawFn, valid: bool) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 3))
    names = ["worker", *(f"sidecar-{i}" for i in range(1, count))]
    gpu = either(
        valid,
        st.integers(0, 8) | st.sampled_from(["0", "2", "8"]),
        st.sampled_from([-1, "1.5", "x", " 1"]),
    )
    result = []
    for name in names:
        container: dict[str, Any] = {
            "name": draw(either(valid, st.just(name), st.sampled_from(["", "worker", "other"])))
        }
        if draw(st.booleans()):
            container["image"] = draw(SHORT_TEXT)
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["limits", "requests"]))
            container["resources"] = {kind: {"nvidia.com/gpu": draw(gpu), "cpu": draw(JSON_VALUES)}}
        if draw(st.booleans()):
            container["env"] = draw(JSON_VALUES)
        if valid or draw(st.booleans()):
            container["command"] = ["train"]
        result.append(container)
    return result


@st.composite
def templates(draw: st.DrawFn, valid: bool) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": draw(containers(valid))}
    passed = {
        "schedulerName": st.none() | SHORT_TEXT,
        "priorityClassName": SHORT_TEXT,
        "nodeSelector": st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=2),
        "restartPolicy": JSON_VALUES,
    }
    for name, values in passed.items():
        if draw(st.booleans()):
            pod[name] = draw(values)
    template: dict[str, Any] = {"spec": pod}
    if draw(st.booleans()):
        labels = st.none() | st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=2)
        metadata = st.fixed_dictionaries({}, optional={"labels": labels, "namespace": JSON_VALUES})
        template["metadata"] = draw(st.none() | metadata)
    return template


@st.composite
def specs(draw: st.DrawFn, valid: bool = False) -> dict[str, Any]:
    """Specs; with ``valid`` every field is valid (only the GPU rule may fail), else any
    field may hold a wrong value, or any JSON value."""
    low, mid, high = sorted(draw(st.lists(st.integers(1, 6), min_size=3, max_size=3)))
    # Within the default range, so that min <= max also holds when only one is given.
    cool_min, cool_max = sorted(draw(st.lists(st.integers(10, 300), min_size=2, max_size=2)))
    cooldown = {"min": st.just(cool_min), "max": st.just(cool_max)}
    fields: dict[str, Any] = {
        "minReplicas": st.just(low),
        "slotsPerWorker": either(valid, st.integers(1, 3), st.integers(0, 65)),
        "backend": either(valid, st.sampled_from(["gloo", "nccl", "auto"]), st.just("mpi")),
        "resetLimit": either(valid, st.none() | st.integers(0, 5), st.just(-1)),
        "elasticTimeoutSeconds": either(valid, st.integers(1, 86400), st.sampled_from([0, 86401])),
        "blacklist": st.fixed_dictionaries(
            {},
            optional={
                "cooldownSeconds": either(
                    valid,
                    st.fixed_dictionaries({}, optional=cooldown),
                    st.sampled_from([{"min": 301}, {"max": 0}]),
                ),
                "scope": either(valid, st.sampled_from(["Node", "Pod"]), st.just("Host")),
            },
        ),
        "cleanPodPolicy": either(
            valid, st.sampled_from(["All", "Running", "None"]), st.just("none")
        ),
    }
    spec: dict[str, Any] = {
        "replicas": mid,
        "maxReplicas": high,
        "template": draw(templates(valid)),
    }
    for name, values in fields.items():
        if draw(st.booleans()):
            spec[name] = draw(values)
    if not valid and draw(st.integers(0, 3)) == 0:
        spec[draw(st.sampled_from([*spec, "other"]))] = draw(JSON_VALUES)
    return spec


@given(specs())
def test_validate_agrees_with_the_crd_schema(spec: dict[str, Any]) -> None:
    errors = validate(spec)
    assert all(isinstance(e, FieldError) and e.field.startswith("spec") for e in errors)
    if schema_errors(SPEC_SCHEMA, spec):
        assert errors, schema_errors(SPEC_SCHEMA, spec)
    if not errors:
        assert schema_errors(SPEC_SCHEMA, spec) == []
        full = parse_spec(spec).model_dump(mode="json", by_alias=True)
        assert schema_errors(SPEC_SCHEMA, full) == []


@given(specs(valid=True))
def test_accepted_specs_round_trip_unchanged(spec: dict[str, Any]) -> None:
    assume(not validate(spec))
    model = ElasticJobSpec.model_validate(spec)
    assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == spec
    full = model.model_dump(mode="json", by_alias=True)
    assert ElasticJobSpec.model_validate(full) == model
    assert validate(full) == []
