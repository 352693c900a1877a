"""``elasticjob submit`` on devcluster's real nodes, as a new user runs it: a folder of their
own code (a script and a module beside it) becomes an ElasticJob running in the worker image,
``--follow`` prints rank 0's log and the job's story to its end and exits 0, and ``status`` and
``delete`` work on it (its code's ConfigMap is the job's, collected with it). The same code
built into an image, scaled and killed: ``test_your_first_job.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import STARTUP_S
from tests.support.kube import Kube

USER_CODE = Path(__file__).parent / "user_code"


def elasticjob(kube: Kube, *args: str) -> list[str]:
    """The ``elasticjob`` command line of ``args`` in the test's namespace."""
    return [sys.executable, "-m", "elasticjob.cli", *args[:1], "-n", kube.ns, *args[1:]]


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=60)


def test_a_submitted_folder_trains_and_is_followed_to_its_end(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    env = {**os.environ, "KUBECONFIG": str(operator.kubeconfig)}
    submit = elasticjob(kube, "submit", str(USER_CODE), "--name", "fit", "--workers", "2")
    output = tmp_path / "follow.log"
    with output.open("w") as out:
        follower = subprocess.Popen(
            [*submit, "--follow", "--", "--epochs", "6", "--pace", "0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            code = follower.wait(timeout=STARTUP_S)
        finally:
            follower.kill()
    followed = output.read_text()
    assert code == 0, followed
    assert "elasticjob.dev/fit created" in followed, followed
    assert "round 1 formed: 2 workers" in followed, followed
    assert "epoch 5: loss" in followed and "training done" in followed, followed
    assert followed.count("epoch 5: loss") == 1, followed
    assert followed.rstrip().splitlines()[-1].startswith("[elasticjob] Succeeded"), followed

    shown = run(elasticjob(kube, "status", "fit"), env)
    assert shown.returncode == 0 and shown.stdout.startswith("fit: Succeeded"), shown
    code_map, job = kube.get("configmap", "fit-code"), kube.get("ej", "fit")
    assert code_map is not None and job is not None
    owners = code_map["metadata"].get("ownerReferences") or []
    assert [o["uid"] for o in owners] == [job["metadata"]["uid"]], owners  # deleted with it
    deleted = run(elasticjob(kube, "delete", "fit"), env)
    assert deleted.returncode == 0, deleted
    kube.wait_gone("ej", "fit", timeout=60)
