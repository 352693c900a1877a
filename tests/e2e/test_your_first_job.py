"""docs/your-first-job.md, followed on devcluster's real nodes: the page's Dockerfile (``FROM``
the worker image) builds an image around a user's own code (a script and a module beside it,
not an example), loaded into the nodes as a registry would serve it; the page's ElasticJob runs
it, is scaled in, loses a worker to SIGKILL and Succeeds."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from devcluster.cluster import Cluster
from devcluster.imagebuild import worker_image
from devcluster.imageload import load_image
from tests.support.elastic_jobs import STARTUP_S, wait_status
from tests.support.kube import Kube

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "your-first-job.md"
USER_CODE = Path(__file__).parent / "user_code"
PAGE_WORKER = "registry.example.com/elasticjob/worker:0.1.0"
"""The worker image as the page names it (pushed to the reader's registry)."""


def blocks(language: str) -> list[str]:
    """The page's code blocks in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def test_the_guides_image_runs_scales_survives_a_kill_and_succeeds(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    dockerfile = blocks("dockerfile")[0]
    assert dockerfile.startswith(f"FROM {PAGE_WORKER}\n"), dockerfile
    context = tmp_path / "train"
    shutil.copytree(USER_CODE, context)
    (context / "requirements.txt").write_text("")  # nothing beyond the worker image's
    (context / "Dockerfile").write_text(dockerfile.replace(PAGE_WORKER, worker_image()))
    (job,) = [doc for doc in map(yaml.safe_load, blocks("yaml")) if doc.get("kind") == "ElasticJob"]
    worker: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    image = worker["image"]
    load_image(operator.config, context, context / "Dockerfile", image, worker_image())

    # The page's job, within devcluster's means: its Secret and volume claim made, smaller
    # requests, two pods to start with, and a pace to watch it by.
    kube.kubectl("create", "secret", "generic", "my-api-keys", "--from-literal=KEY=value")
    registry = ["--docker-server=registry.example.com", "--docker-username=u"]
    kube.kubectl("create", "secret", "docker-registry", "regcred", *registry, "--docker-password=p")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "training-data"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kube.apply(claim)
    worker["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    worker["command"] = ["python", "train.py", "--epochs", "12", "--pace", "0.15"]
    job["spec"].update(replicas=3, minReplicas=1, maxReplicas=3)
    job["spec"].pop("activeDeadlineSeconds")
    kube.apply(job)
    name = job["metadata"]["name"]

    wait_status(kube, name, "3 workers", lambda s: s.get("worldSize") == 3, STARTUP_S)
    kube.kubectl("scale", f"ej/{name}", "--replicas=2")
    scaled = wait_status(kube, name, "2 workers", lambda s: s.get("worldSize") == 2, STARTUP_S)
    victim = next(w for w in scaled["workers"] if 0 not in w["ranks"])
    operator.faults.kill(victim["pod"], kube.ns)
    done = wait_status(kube, name, "its end", lambda s: s.get("phase") == "Succeeded", 300)
    assert done["resetCount"] >= 2, done  # the scale-in and the kill
    pods = [p["metadata"]["name"] for p in kube.pods(f"elasticjob.dev/job-name={name}")]
    log = "\n".join(kube.kubectl("logs", pod, check=False) for pod in pods)
    assert "epoch 11: loss" in log and "training done" in log, log
