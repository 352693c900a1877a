"""spec.checkpoint: its admission rules (a row each, naming the field), the CRD schema, what
the worker pods get (the volume mounted at the path, the policy's variables), the driver's
fallback switch, and the status's last checkpoint and restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from elasticjob.operator.api import (
    CheckpointStatus,
    ElasticJobStatus,
    RestoreStatus,
    parse_spec,
    validate,
)
from elasticjob.operator.pod_launcher import driver_settings
from elasticjob.operator.pods import worker_pod
from elasticjob.operator.status_render import status_of
from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_INTERVAL,
    ENV_CHECKPOINT_KEEP,
)
from tests.support.crd_model import SPEC_SCHEMA, good_spec, schema_errors
from tests.support.observations import T0, T1, obs

REPO = Path(__file__).resolve().parents[3]
JOB = {"metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"}}
CLAIM = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "train-ckpt"}}


def with_checkpoint(
    checkpoint: dict[str, Any] | None = None,
    *,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``good_spec()`` with a checkpoint policy and the volume ``CLAIM`` in its template."""
    spec = good_spec()
    pod_spec = spec["template"]["spec"]
    pod_spec["volumes"] = [CLAIM] if volumes is None else volumes
    if mounts is not None:
        pod_spec["containers"][0]["volumeMounts"] = mounts
    spec["checkpoint"] = (
        {"volume": "ckpt", "path": "/ckpt", "everyCommits": 10}
        if checkpoint is None
        else checkpoint
    )
    return spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(with_checkpoint(), [], id="good"),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/ckpt/", "intervalSeconds": 60, "keep": 1}),
            [],
            id="interval-trailing-slash-keep-1",
        ),
        pytest.param(
            with_checkpoint(mounts=[{"name": "ckpt", "mountPath": "/ckpt"}]),
            [],
            id="already-mounted-there",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/ckpt"}),
            [("spec.checkpoint", "exactly one of everyCommits and intervalSeconds")],
            id="no-frequency",
        ),
        pytest.param(
            with_checkpoint(
                {"volume": "ckpt", "path": "/ckpt", "everyCommits": 5, "intervalSeconds": 5}
            ),
            [("spec.checkpoint", "exactly one of everyCommits and intervalSeconds")],
            id="both-frequencies",
        ),
        pytest.param(
            with_checkpoint({"volume": "data", "path": "/ckpt", "everyCommits": 5}),
            [("spec.checkpoint.volume", "'data' is not a volume of the pod template")],
            id="unknown-volume",
        ),
        pytest.param(
            with_checkpoint(volumes=[]),
            [("spec.checkpoint.volume", "(spec.template.spec.volumes: none)")],
            id="no-volumes",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "ckpt", "everyCommits": 5}),
            [("spec.checkpoint.path", "must be an absolute, normalised folder path")],
            id="relative-path",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/a/../ckpt", "everyCommits": 5}),
            [("spec.checkpoint.path", "must be an absolute, normalised folder path")],
            id="unnormalised-path",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/", "everyCommits": 5}),
            [("spec.checkpoint.path", "other than /")],
            id="root-path",
        ),
        pytest.param(
            with_checkpoint(
                volumes=[CLAIM, {"name": "data", "emptyDir": {}}],
                mounts=[{"name": "data", "mountPath": "/ckpt"}],
            ),
            [("spec.checkpoint.path", "mounts the volume 'data' at '/ckpt', not 'ckpt'")],
            id="another-volume-mounted-there",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/ckpt", "everyCommits": 0}),
            [("spec.checkpoint.everyCommits", "greater than or equal to 1")],
            id="every-zero-commits",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/ckpt", "everyCommits": 1, "keep": 0}),
            [("spec.checkpoint.keep", "greater than or equal to 1")],
            id="keep-zero",
        ),
        pytest.param(
            with_checkpoint({"path": "/ckpt", "everyCommits": 1}),
            [("spec.checkpoint.volume", "Field required")],
            id="volume-missing",
        ),
        pytest.param(
            with_checkpoint({"volume": "ckpt", "path": "/ckpt", "every_commits": 1}),
            [("spec.checkpoint.every_commits", "Extra inputs")],
            id="snake-case",
        ),
    ],
)
def test_validate_checkpoint(spec: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    errors = validate(spec)
    assert [e.field for e in errors] == [field for field, _ in expected], errors
    for error, (_, fragment) in zip(errors, expected, strict=True):
        assert fragment in error.message, error


def test_the_crd_schema_takes_a_good_checkpoint_and_refuses_a_bad_keep() -> None:
    assert schema_errors(SPEC_SCHEMA, with_checkpoint()) == []
    bad = with_checkpoint({"volume": "ckpt", "path": "/ckpt", "everyCommits": 1, "keep": 0})
    assert schema_errors(SPEC_SCHEMA, bad)


def policy_env(container: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e["value"]
        for e in container["env"]
        if e["name"].startswith("ELASTICJOB_CHECKPOINT")
    }


def test_worker_pods_mount_the_volume_at_the_path_and_are_told_the_policy() -> None:
    spec = parse_spec(
        with_checkpoint({"volume": "ckpt", "path": "/ckpt", "intervalSeconds": 30, "keep": 2})
    )
    pod = worker_pod(JOB, spec, "train-worker-b2c4d", rendezvous_url="http://rdzv:8470")
    (worker,) = pod["spec"]["containers"]
    assert worker["volumeMounts"] == [{"name": "ckpt", "mountPath": "/ckpt"}]
    assert pod["spec"]["volumes"] == [CLAIM]
    assert policy_env(worker) == {
        ENV_CHECKPOINT_DIR: "/ckpt",
        ENV_CHECKPOINT_EVERY_COMMITS: "0",
        ENV_CHECKPOINT_INTERVAL: "30",
        ENV_CHECKPOINT_KEEP: "2",
    }
    assert driver_settings(spec).checkpoint_fallback


def test_a_mount_the_template_has_is_kept_as_it_is() -> None:
    mount = {"name": "ckpt", "mountPath": "/ckpt", "subPath": "jobs/train"}
    spec = parse_spec(with_checkpoint(mounts=[mount]))
    (worker,) = worker_pod(JOB, spec, "train-worker-b2c4d", rendezvous_url="http://rdzv:8470")[
        "spec"
    ]["containers"]
    assert worker["volumeMounts"] == [mount]
    assert policy_env(worker)[ENV_CHECKPOINT_EVERY_COMMITS] == "10"


def test_without_a_policy_nothing_is_mounted_and_the_fallback_is_off() -> None:
    spec = parse_spec(good_spec())
    (worker,) = worker_pod(JOB, spec, "train-worker-b2c4d", rendezvous_url="http://rdzv:8470")[
        "spec"
    ]["containers"]
    assert "volumeMounts" not in worker and policy_env(worker) == {}
    assert not driver_settings(spec).checkpoint_fallback


CKPT = CheckpointStatus(name="ckpt-00000100", epoch=1, step=100, seconds=0.5, size_bytes=10)


def test_the_status_shows_the_last_checkpoint_and_stamps_a_restore_once() -> None:
    restore = RestoreStatus(checkpoint=CKPT, round=5, steps_lost=80)
    first = status_of(obs(last_checkpoint=CKPT, restored=restore), ElasticJobStatus(), "s", 1, T0)
    assert first.last_checkpoint == CKPT
    assert first.restored is not None and first.restored.time == T0
    assert first.restored.steps_lost == 80
    later = status_of(obs(restored=restore), first, "s", 1, T1)
    assert later.restored == first.restored, "the same restore keeps its time"
    assert later.last_checkpoint == CKPT, "carried over"
    dumped = later.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["restored"]["checkpoint"]["name"] == "ckpt-00000100"
    assert dumped["restored"]["stepsLost"] == 80
    again = status_of(obs(restored=restore.model_copy(update={"round": 7})), later, "s", 1, T1)
    assert again.restored is not None and (again.restored.round, again.restored.time) == (7, T1)


def test_the_example_manifest_is_a_valid_job_with_its_claim() -> None:
    claim, job = yaml.safe_load_all((REPO / "examples/elasticjob-checkpoint.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim"
    spec = parse_spec(job["spec"])
    assert spec.checkpoint is not None and spec.checkpoint.path == "/checkpoints"
    volumes = (spec.template.spec.model_extra or {})["volumes"]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
