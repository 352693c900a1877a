"""Admission of what a pod template must leave to the operator: the worker contract's
variables, the pods' names and owners; and of what the API server would refuse only once the
operator creates the pods (an image that is not a name, a name too long for a label)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticjob.driver.driver_types import JobMode
from elasticjob.library_env import ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME
from elasticjob.operator.api import FieldError, parse_spec, validate
from elasticjob.operator.api.validation import name_errors, namespace_errors
from elasticjob.operator.pods import worker_pod
from elasticjob.worker_contract import ENV_JOB, ENV_TOKEN, RESTART_AGENT_MODULE, WORKER_CONTRACT_ENV
from tests.support.crd_model import with_changes

REPO = Path(__file__).resolve().parents[3]
RESERVED = (
    "is a variable of the worker contract, which the operator sets "
    "(every ELASTICJOB_* name is reserved)"
)


def template_with(**container: Any) -> dict[str, Any]:
    worker = {"name": "worker", "image": "img", **container}
    return with_changes(template={"spec": {"containers": [worker]}})


@pytest.mark.parametrize("name", sorted(WORKER_CONTRACT_ENV))
def test_every_variable_of_the_worker_contract_is_refused_in_env(name: str) -> None:
    env = [{"name": "LR", "value": "0.1"}, {"name": "EPOCHS", "value": "3"}]
    env.append({"name": name, "value": "x"})
    assert validate(template_with(env=env)) == [
        FieldError("spec.template.spec.containers[0].env[2].name", f"{name} {RESERVED}")
    ]


def test_another_jobs_token_secret_is_refused() -> None:
    planted = {
        "name": ENV_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": "other-rendezvous", "key": "token"}},
    }
    (error,) = validate(template_with(env=[planted]))
    assert error.field == "spec.template.spec.containers[0].env[0].name"


def test_the_contract_prefix_is_reserved_for_names_to_come() -> None:
    (error,) = validate(template_with(env=[{"name": "ELASTICJOB_SOMETHING_NEW", "value": "1"}]))
    assert error.field == "spec.template.spec.containers[0].env[0].name"


def test_init_containers_and_sidecars_may_not_set_the_contract_either() -> None:
    spec = with_changes(
        template={
            "spec": {
                "containers": [
                    {"name": "worker", "image": "img"},
                    {"name": "side", "image": "img", "env": [{"name": ENV_JOB, "value": "x"}]},
                ],
                "initContainers": [{"name": "init", "image": "img", "env": [{"name": ENV_TOKEN}]}],
            }
        }
    )
    assert [e.field for e in validate(spec)] == [
        "spec.template.spec.containers[1].env[0].name",
        "spec.template.spec.initContainers[0].env[0].name",
    ]


@pytest.mark.parametrize(
    ("prefix", "refused"),
    [
        ("ELASTICJOB_", True),
        ("ELASTICJOB_X_", True),
        ("ELASTIC", True),  # a key "JOB_TOKEN" makes ELASTICJOB_TOKEN
        ("APP_", False),
        ("", False),
    ],
)
def test_env_from_prefixes_that_can_make_a_contract_name_are_refused(
    prefix: str, refused: bool
) -> None:
    spec = template_with(envFrom=[{"prefix": prefix, "configMapRef": {"name": "settings"}}])
    fields = [e.field for e in validate(spec)]
    assert fields == (["spec.template.spec.containers[0].envFrom[0].prefix"] if refused else [])


@pytest.mark.parametrize(
    "key", ["name", "generateName", "namespace", "finalizers", "ownerReferences"]
)
def test_template_metadata_the_operator_sets_is_refused(key: str) -> None:
    value: Any = [] if key in ("finalizers", "ownerReferences") else "x"
    spec = with_changes(
        template={
            "metadata": {key: value, "labels": {"team": "a"}},
            "spec": {"containers": [{"name": "worker", "image": "img"}]},
        }
    )
    assert validate(spec) == [
        FieldError(
            f"spec.template.metadata.{key}",
            "must not be set: the operator names and owns the worker pods",
        )
    ]


@pytest.mark.parametrize(
    ("labels", "refused"),
    [
        pytest.param({"team": "a", "app.kubernetes.io/name": "trainer"}, [], id="the user's"),
        pytest.param({"elasticjob.dev/job-name": "other"}, ["elasticjob.dev/job-name"], id="job"),
        pytest.param({"elasticjob.dev/health-check": "Passed"}, ["elasticjob.dev/health-check"]),
        pytest.param({"elasticjob.dev/anything": "x"}, ["elasticjob.dev/anything"], id="any"),
        pytest.param({"elasticjob.dev.io/x": "y", "my.elasticjob.dev/x": "y"}, [], id="lookalikes"),
    ],
)
def test_the_operators_own_labels_are_refused_in_the_template(
    labels: dict[str, str], refused: list[str]
) -> None:
    spec = with_changes(
        template={
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "worker", "image": "img"}]},
        }
    )
    errors = validate(spec)
    assert [e.field for e in errors] == [f"spec.template.metadata.labels[{k}]" for k in refused]
    assert all("are the operator's own" in e.message for e in errors)


@pytest.mark.parametrize(
    ("namespace", "operator_namespace", "refused"),
    [
        pytest.param("ml", "elasticjob-system", False, id="another namespace"),
        pytest.param("elasticjob-system", "elasticjob-system", True, id="the operator's"),
        pytest.param("ml", None, False, id="the operator's not known"),
        pytest.param(None, "elasticjob-system", False, id="no namespace yet"),
    ],
)
def test_no_job_runs_in_the_operators_own_namespace(
    namespace: str | None, operator_namespace: str | None, refused: bool
) -> None:
    errors = namespace_errors(namespace, operator_namespace)
    assert [e.field for e in errors] == (["metadata.namespace"] if refused else [])
    assert all("the operator's own namespace" in e.message for e in errors)


@pytest.mark.parametrize("image", [123, "", "  ", None, ...])
def test_a_container_without_an_image_name_is_refused(image: object) -> None:
    container: dict[str, Any] = {"name": "worker"}
    if image is not ...:
        container["image"] = image
    spec = with_changes(template={"spec": {"containers": [container]}})
    shown = None if image is ... else image
    assert validate(spec) == [
        FieldError(
            "spec.template.spec.containers[0].image",
            f"must be a container image name, got {shown!r}",
        )
    ]


def test_init_containers_need_an_image_too() -> None:
    spec = template_with()
    spec["template"]["spec"]["initContainers"] = [{"name": "init", "image": 7}]
    assert [e.field for e in validate(spec)] == ["spec.template.spec.initContainers[0].image"]


@pytest.mark.parametrize(("length", "refused"), [(1, False), (63, False), (64, True), (200, True)])
def test_a_job_name_must_fit_a_label_value(length: int, refused: bool) -> None:
    errors = name_errors("a" * length)
    assert [e.field for e in errors] == (["metadata.name"] if refused else [])
    if refused:
        assert f"got {length}" in errors[0].message
    assert name_errors(None) == []


def test_worker_timeouts_are_spec_fields() -> None:
    spec = parse_spec(with_changes(collectiveTimeoutSeconds=30, roundWaitSeconds=600))
    assert (spec.collective_timeout_seconds, spec.round_wait_seconds) == (30, 600)
    assert [e.field for e in validate(with_changes(roundWaitSeconds=0))] == [
        "spec.roundWaitSeconds"
    ]
    assert [e.field for e in validate(with_changes(collectiveTimeoutSeconds="60"))] == [
        "spec.collectiveTimeoutSeconds"
    ]


def test_the_restricted_example_is_admitted() -> None:
    job = yaml.safe_load((REPO / "examples" / "elasticjob-restricted.yaml").read_text())
    assert name_errors(job["metadata"]["name"]) == []
    spec = parse_spec(job["spec"])
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    worker = spec.template.spec.worker_container()
    assert worker is not None
    context = (worker.model_extra or {})["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True


def test_the_gpu_example_is_admitted_with_one_gpu_per_slot() -> None:
    job = yaml.safe_load((REPO / "examples" / "elasticjob-gpu.yaml").read_text())
    assert validate(job["spec"]) == []
    spec = parse_spec(job["spec"])
    worker = spec.template.spec.worker_container()
    assert worker is not None
    limits = (worker.model_extra or {})["resources"]["limits"]
    assert spec.slots_per_worker == int(limits["nvidia.com/gpu"])
    assert spec.backend.value == "nccl"
    assert not {e["name"] for e in (worker.model_extra or {})["env"]} & {
        ENV_GLOO_SOCKET_IFNAME,
        ENV_NCCL_SOCKET_IFNAME,
    }, "the runtime picks the interface"


def test_the_restart_example_is_admitted_and_runs_its_script_under_the_agent() -> None:
    documents = list(
        yaml.safe_load_all((REPO / "examples" / "elasticjob-restart.yaml").read_text())
    )
    job = next(d for d in documents if d["kind"] == "ElasticJob")
    assert validate(job["spec"]) == []
    spec = parse_spec(job["spec"])
    assert (spec.mode, spec.max_restarts) == (JobMode.RESTART, 3)
    job["metadata"] |= {"namespace": "ml", "uid": "uid-1"}  # what the API server gives it
    (worker,) = worker_pod(job, spec, "train-worker-b2c4d", rendezvous_url="http://r:1")["spec"][
        "containers"
    ]
    assert worker["command"][:4] == ["python", "-m", RESTART_AGENT_MODULE, "--"]
    assert worker["command"][4:6] == ["python", "examples/torchrun_digits/train.py"]
