"""The ElasticJob and ConfigMap ``elasticjob submit`` makes (``elasticjob.submit``'s ``build``):
valid by the operator's own model and admission rules, each option where it belongs, and a
clear refusal of what admission would refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticjob.operator.api import ElasticJobSpec
from elasticjob.submit import RequestError, build
from elasticjob.submit.job_request import CODE_DIR, DEFAULT_IMAGE, WorkerRange, default_name


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "Train_Model.py"
    path.write_text("print(1)\n")
    return path


def worker(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def test_a_script_runs_in_the_worker_image_from_its_config_map(script: Path) -> None:
    job, config_map = build(script, args=["--epochs", "3"])
    ElasticJobSpec.model_validate(job["spec"])
    assert job["metadata"]["name"].startswith("train-model-")
    assert config_map["metadata"]["name"] == f"{job['metadata']['name']}-code"
    container = worker(job)
    assert container["image"] == DEFAULT_IMAGE
    assert container["command"] == ["python", "Train_Model.py", "--epochs", "3"]
    assert container["workingDir"] == CODE_DIR
    volume = job["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert job["spec"]["mode"] == "elastic"
    assert (job["spec"]["replicas"], job["spec"]["minReplicas"], job["spec"]["maxReplicas"]) == (
        1,
        1,
        1,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", WorkerRange(4, 4, 4)), ("2:8", WorkerRange(2, 8, 8)), ("1:1", WorkerRange(1, 1, 1))],
)
def test_worker_ranges(text: str, expected: WorkerRange) -> None:
    assert WorkerRange.parse(text) == expected


@pytest.mark.parametrize("text", ["0", "3:2", "two", "2:", "1:2:3"])
def test_bad_worker_ranges_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(RequestError, match="--workers"):
        WorkerRange.parse(text)


def test_gpus_are_slots_and_a_limit_and_options_land_in_the_pod(script: Path) -> None:
    job, _ = build(
        script,
        name="big",
        workers="2:4",
        gpus=2,
        mode="restart",
        image="registry.example.com/me/train:1",
        env={"B": "2", "A": "1"},
        cpu="4",
        memory="8Gi",
    )
    ElasticJobSpec.model_validate(job["spec"])
    assert job["metadata"]["name"] == "big"
    assert job["spec"]["slotsPerWorker"] == 2 and job["spec"]["mode"] == "restart"
    container = worker(job)
    assert container["image"] == "registry.example.com/me/train:1"
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "8Gi"},
        "limits": {"memory": "8Gi", "nvidia.com/gpu": 2},
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "Bad_Name"}, "--name: lower-case letters"),
        ({"name": "x" * 70}, "metadata.name"),
        ({"env": {"ELASTICJOB_TOKEN": "x"}}, "ELASTICJOB_TOKEN"),
        ({"mode": "torchrun"}, "--mode: elastic or restart"),
        ({"gpus": -1}, "--gpus must be >= 0"),
    ],
)
def test_what_admission_would_refuse_is_refused_before_sending(
    script: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        build(script, **options)


@pytest.mark.parametrize(
    ("script", "stem"),
    [("train.py", "train"), ("src/My Model.py", "my-model"), ("___.py", "job")],
)
def test_default_names_are_valid_and_unique(script: str, stem: str) -> None:
    first, second = default_name(script), default_name(script)
    assert first.startswith(f"{stem}-") and first != second
