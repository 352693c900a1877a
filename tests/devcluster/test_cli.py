"""The CLI against the session's cluster: status, logs, faults."""

from __future__ import annotations

import pytest

from tests.support.kube import Kube, container_state, devcluster_cli, pod_manifest

pytestmark = pytest.mark.devcluster


def test_status_logs_and_fault_commands(kube: Kube) -> None:
    status = devcluster_cli(kube, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "node node-1" in status.stdout
    assert str(kube.cluster.kubeconfig) in devcluster_cli(kube, "kubeconfig").stdout

    kube.apply(pod_manifest("clipod", "print('from the cli pod')"))
    kube.wait_phase("clipod", "Succeeded")
    logs = devcluster_cli(kube, "logs", "clipod", "-n", kube.ns)
    assert logs.stdout == "from the cli pod\n"

    kube.apply(pod_manifest("clikill", "import time; time.sleep(600)", restart="Never"))
    kube.wait_phase("clikill", "Running")
    killed = devcluster_cli(kube, "fault", "kill", "clikill", "-n", kube.ns)
    assert killed.returncode == 0, killed.stderr
    pod = kube.wait_phase("clikill", "Failed")
    assert container_state(pod)["terminated"]["exitCode"] == 137
    missing = devcluster_cli(kube, "fault", "kill", "nosuchpod", "-n", kube.ns)
    assert missing.returncode == 1
    assert "does not run here" in missing.stderr
