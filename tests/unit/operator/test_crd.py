"""The generated ElasticJob CRD: drift, structural schema, defaults, printer columns."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import BaseModel

from elasticjob.operator.api import (
    ConditionStatus,
    ConditionType,
    ElasticJobSpec,
    ElasticJobStatus,
    Phase,
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
from tests.support.crd_model import (
    CRD_FILE,
    ROOT,
    SPEC_SCHEMA,
    STATUS_SCHEMA,
    VERSION,
    apply_defaults,
    good_spec,
    schema_errors,
    schema_nodes,
)

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
        "Goodput": ("number", ".status.goodput.ratio"),
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
