"""The CLI against the session's cluster: status, logs, faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devcluster.config import REPO_ROOT
from tests.devcluster.helpers import Kube, container_state, pod_manifest

pytestmark = pytest.mark.devcluster


def _cli(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devcluster", "--run-dir", str(kube.cluster.config.run_dir), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_logs_and_fault_commands(kube: Kube) -> None:
    status = _cli(kube, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "node node-1" in status.stdout
    assert str(kube.cluster.kubeconfig) in _cli(kube, "kubeconfig").stdout

    kube.apply(pod_manifest("clipod", "print('from the cli pod')"))
    kube.wait_phase("clipod", "Succeeded")
    logs = _cli(kube, "logs", "clipod", "-n", kube.ns)
    assert logs.stdout == "from the cli pod\n"

    kube.apply(pod_manifest("clikill", "import time; time.sleep(600)", restart="Never"))
    kube.wait_phase("clikill", "Running")
    killed = _cli(kube, "fault", "kill", "clikill", "-n", kube.ns)
    assert killed.returncode == 0, killed.stderr
    pod = kube.wait_phase("clikill", "Failed")
    assert container_state(pod)["terminated"]["exitCode"] == 137
    missing = _cli(kube, "fault", "kill", "nosuchpod", "-n", kube.ns)
    assert missing.returncode == 1
    assert "does not run here" in missing.stderr
