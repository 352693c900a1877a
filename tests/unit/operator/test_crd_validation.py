"""The ElasticJob API's validate(): table of cases and properties against the CRD schema."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from elasticjob.operator.api import (
    ElasticJobSpec,
    FieldError,
    InvalidSpecError,
    parse_spec,
    validate,
)
from tests.support.crd_model import (
    SPEC_SCHEMA,
    good_spec,
    gpus,
    schema_errors,
    with_changes,
    with_containers,
)

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
                        "containers": [
                            gpus("worker", 2) | {"image": "w"},
                            {"name": "sidecar", "image": "s"},
                        ],
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
            with_containers({"name": "worker"}, mode="restart"),
            [(f"{NVIDIA.rsplit('.', 1)[0]}.command", "is required when mode is restart")],
            id="restart-mode-needs-a-command",
        ),
        pytest.param(
            with_changes(mode="torchrun"),
            [("spec.mode", "'elastic' or 'restart'")],
            id="mode-enum",
        ),
        pytest.param(
            with_changes(maxRestarts=-1),
            [("spec.maxRestarts", "greater than or equal to 0")],
            id="max-restarts-negative",
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
            with_changes(maxFailedRoundsWithoutCommit=-1),
            [("spec.maxFailedRoundsWithoutCommit", "greater than or equal to 0")],
            id="failed-rounds-limit-negative",
        ),
        pytest.param(
            with_changes(activeDeadlineSeconds=0),
            [("spec.activeDeadlineSeconds", "greater than or equal to 1")],
            id="active-deadline-zero",
        ),
        pytest.param(
            with_changes(ttlSecondsAfterFinished=-1),
            [("spec.ttlSecondsAfterFinished", "greater than or equal to 0")],
            id="ttl-negative",
        ),
        pytest.param(
            with_changes(startTimeoutSeconds=5),
            [("spec.startTimeoutSeconds", "greater than or equal to 10")],
            id="start-timeout-too-short",
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
            with_changes(healthCheck={"minRelative": 0, "timeoutSeconds": 5}),
            [
                ("spec.healthCheck.minRelative", "greater than or equal to 0.01"),
                ("spec.healthCheck.timeoutSeconds", "greater than or equal to 10"),
            ],
            id="health-check-out-of-range",
        ),
        pytest.param(
            with_containers({"name": "worker", "command": ["train"]}, healthCheck={}),
            [],
            id="health-check-defaults",
        ),
        pytest.param(
            with_containers({"name": "worker", "args": ["--lr", "1"]}, healthCheck={}),
            [("spec.template.spec.containers[0].command", "is required with healthCheck")],
            id="health-check-without-a-command",
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
IMAGES = st.from_regex(r"[a-z][a-z0-9./:-]{0,8}", fullmatch=True)


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
        if valid or draw(st.booleans()):
            container["image"] = draw(either(valid, IMAGES, SHORT_TEXT | JSON_VALUES))
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
        operators = {} if valid else {"namespace": JSON_VALUES}
        metadata = st.fixed_dictionaries({}, optional={"labels": labels, **operators})
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
        "startTimeoutSeconds": either(valid, st.integers(10, 86400), st.sampled_from([9, 86401])),
        "activeDeadlineSeconds": either(valid, st.integers(1, 10**6), st.sampled_from([0, -5])),
        "ttlSecondsAfterFinished": either(valid, st.integers(0, 10**6), st.sampled_from([-1, 1.5])),
        "maxFailedRoundsWithoutCommit": either(
            valid, st.integers(0, 1000), st.sampled_from([-1, 1001, 2.5])
        ),
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
        "healthCheck": st.fixed_dictionaries(
            {},
            optional={
                "minRelative": either(
                    valid, st.sampled_from([0.01, 0.5, 1]), st.sampled_from([0, 1.5])
                ),
                "timeoutSeconds": either(
                    valid, st.integers(10, 3600), st.sampled_from([9, 3601, 30.5])
                ),
            },
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
