"""Fault injection: killed and frozen processes, NotReady nodes, preemption notices."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kube import (
    Kube,
    container_state,
    node_ready_untainted,
    pod_manifest,
    read_proc_state,
)

pytestmark = pytest.mark.devcluster

SLEEPER = "import time; print('up', flush=True); time.sleep(3600)"


@pytest.fixture
def node3(kube: Kube) -> Iterator[str]:
    """node-3, made Ready (and untainted) again after the test."""
    yield "node-3"
    kube.cluster.faults.node_ready("node-3")
    kube.wait(
        "node-3 to be Ready and untainted again", lambda: node_ready_untainted(kube, "node-3"), 60
    )


def test_kill_fault_makes_the_container_restart(kube: Kube) -> None:
    kube.apply(pod_manifest("killme", SLEEPER, restart="Always"))
    kube.wait_phase("killme", "Running")
    pids = kube.cluster.faults.kill("killme", kube.ns)
    assert pids
    pod = kube.wait_pod(
        "killme",
        lambda p: (
            p["status"]["containerStatuses"][0]["restartCount"] == 1
            and "running" in container_state(p)
        ),
        "restarted once",
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137


def group_states(pgid: int) -> list[tuple[int, str, str]]:
    """Every process of the process group ``pgid``: its pid, state and command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            if entry.name.isdigit() and int(fields[2]) == pgid:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append((int(entry.name), fields[0], command))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_stop_and_cont_freeze_and_thaw_the_process(kube: Kube) -> None:
    kube.apply(pod_manifest("freezeme", SLEEPER, restart="Always"))
    kube.wait_phase("freezeme", "Running")
    # Stopped while the pod's shell still sets it up, the shell would wait for a stopped
    # child in vfork (state D, not T) until the child is let go: stop the program itself.
    kube.wait("the program to be up", lambda: "up" in kube.disk_log("freezeme"))
    [pid] = kube.cluster.faults.stop("freezeme", kube.ns)
    kube.wait(
        "the process to be stopped",
        lambda: read_proc_state(pid) == "T",
        explain=lambda: f"its group's processes (pid, state, command): {group_states(pid)}",
    )
    kube.cluster.faults.cont("freezeme", kube.ns)
    kube.wait("the process to run again", lambda: read_proc_state(pid) in "RS")


def test_notready_node_gets_its_pods_evicted(kube: Kube, node3: str) -> None:
    cfg = kube.cluster.config
    kube.apply(pod_manifest("stranded", SLEEPER, restart="Always", nodeName=node3))
    kube.wait_phase("stranded", "Running")
    started = time.monotonic()
    kube.cluster.faults.node_notready(node3)
    kube.wait(
        f"{node3} to become NotReady",
        lambda: not node_ready_untainted(kube, node3),
        timeout=cfg.node_monitor_grace_seconds + 20,
    )

    def evicted() -> bool:
        pod = kube.get("pod", "stranded")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    # Heartbeats stop -> NotReady after the grace period -> NoExecute taint ->
    # eviction after the default toleration; allow 20 s for a busy machine.
    budget = cfg.node_monitor_grace_seconds + cfg.eviction_toleration_seconds + 20
    kube.wait("pod stranded to be evicted", evicted, timeout=budget - (time.monotonic() - started))
    kube.wait_gone("pod", "stranded", timeout=30)


def test_evict_gives_a_preemption_notice_then_sigterm(kube: Kube) -> None:
    script = (
        "import signal, sys, time\n"
        "from pathlib import Path\n"
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "ns = Path('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read_text()\n"
        "def bye(signum, frame):\n"
        "    pod = client.CoreV1Api().read_namespaced_pod('preempted', ns)\n"
        "    kinds = sorted(c.type for c in pod.status.conditions)\n"
        "    print('SIGTERM with conditions', ' '.join(kinds), flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n"
    )
    kube.kubectl(
        "create", "rolebinding", "view", "--clusterrole=view", f"--serviceaccount={kube.ns}:default"
    )
    kube.apply(
        pod_manifest(
            "preempted", script, image="elasticjob/worker:dev", terminationGracePeriodSeconds=30
        )
    )
    kube.wait_phase("preempted", "Running")
    kube.wait("the handler to be installed", lambda: "waiting" in kube.disk_log("preempted"))
    kube.cluster.faults.evict("preempted", kube.ns)
    kube.wait_gone("pod", "preempted", timeout=30)
    assert "SIGTERM with conditions" in kube.disk_log("preempted")
    assert "DisruptionTarget" in kube.disk_log("preempted")


def test_node_delete_removes_its_pods_and_add_brings_it_back(kube: Kube) -> None:
    kube.apply(pod_manifest("onnode4", SLEEPER, restart="Always", nodeName="node-4"))
    kube.wait_phase("onnode4", "Running")
    pods = kube.cluster.faults.agent_status()["pods"]
    pids = next(p["pids"] for p in pods if (p["namespace"], p["name"]) == (kube.ns, "onnode4"))
    assert pids
    try:
        kube.cluster.faults.node_delete("node-4")
        kube.wait_gone("pod", "onnode4")
        assert kube.cluster.kubectl("get", "node", "node-4", check=False).returncode != 0
        for p in pids:
            assert not Path(f"/proc/{p}").exists() or read_proc_state(p) == "Z"
    finally:
        kube.cluster.faults.node_add("node-4")
    kube.wait("node-4 to be Ready again", lambda: node_ready_untainted(kube, "node-4"), 60)
