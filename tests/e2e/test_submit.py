"""``elasticjob submit`` on devcluster's real nodes, as a new user runs it: a folder of their
own code (a script and a module beside it) becomes an ElasticJob running in the worker image,
``--follow`` prints rank 0's log and the job's story to its end, a worker killed on the way is
recovered from, and ``status`` and ``delete`` work on it (its code's ConfigMap goes with it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import STARTUP_S, wait_status
from tests.support.kube import Kube

USER_CODE = Path(__file__).parent / "user_code"


def elasticjob(kube: Kube, *args: str) -> list[str]:
    """The ``elasticjob`` command line of ``args`` in the test's namespace."""
    return [sys.executable, "-m", "elasticjob.cli", *args[:1], "-n", kube.ns, *args[1:]]


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=60)


def test_a_submitted_folder_trains_survives_a_killed_worker_and_is_followed_to_its_end(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    env = {**os.environ, "KUBECONFIG": str(operator.kubeconfig)}
    submit = elasticjob(kube, "submit", str(USER_CODE), "--name", "fit", "--workers", "2")
    output = tmp_path / "follow.log"
    with output.open("w") as out:
        follower = subprocess.Popen(
            [*submit, "--follow", "--", "--epochs", "12", "--pace", "0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            training = wait_status(  # (its progress is written every 10 s at most)
                kube,
                "fit",
                "training on 2 workers",
                lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2,
                STARTUP_S,
            )
            victim = next(w for w in training["workers"] if 0 not in w["ranks"])
            operator.faults.kill(victim["pod"], kube.ns)
            code = follower.wait(timeout=300)
        finally:
            follower.kill()
    followed = output.read_text()
    assert code == 0, followed
    assert "elasticjob.dev/fit created" in followed, followed
    assert "round 2 formed" in followed, followed
    assert "epoch 11: loss" in followed and "training done" in followed, followed
    assert followed.count("epoch 11: loss") == 1, followed
    assert followed.rstrip().splitlines()[-1].startswith("[elasticjob] Succeeded"), followed

    shown = run(elasticjob(kube, "status", "fit"), env)
    assert shown.returncode == 0 and shown.stdout.startswith("fit: Succeeded"), shown
    assert kube.get("configmap", "fit-code") is not None
    deleted = run(elasticjob(kube, "delete", "fit"), env)
    assert deleted.returncode == 0, deleted
    kube.wait_gone("ej", "fit", timeout=60)
    kube.wait_gone("configmap", "fit-code", timeout=120)
