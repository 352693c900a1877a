"""Faults on real nodes: the same ``cluster.faults`` calls as on process nodes, plus partitions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kube import (
    Kube,
    container_state,
    devcluster_cli,
    node_ready_untainted,
    read_proc_state,
)
from tests.support.real_pods import SLEEPER, condition, fetch, real_pod, server, service

pytestmark = pytest.mark.devcluster


@pytest.fixture
def node3(real_kube: Kube) -> Iterator[str]:
    """node-3, brought back (Ready, untainted) after the test."""
    yield "node-3"
    real_kube.cluster.faults.node_add("node-3")
    real_kube.wait("node-3 Ready again", lambda: node_ready_untainted(real_kube, "node-3"), 90)


def test_kill_sigkills_the_container_and_the_kubelet_restarts_it(real_kube: Kube) -> None:
    real_kube.apply(real_pod("killme", SLEEPER, restart="Always"))
    real_kube.wait_phase("killme", "Running", timeout=120)
    pids = real_kube.cluster.faults.kill("killme", real_kube.ns)
    assert pids
    pod = real_kube.wait_pod(
        "killme",
        lambda p: (
            p["status"]["containerStatuses"][0]["restartCount"] == 1
            and "running" in container_state(p)
        ),
        "restarted once",
        timeout=60,
    )
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137


def test_stop_and_cont_freeze_and_thaw_the_container(real_kube: Kube) -> None:
    real_kube.apply(real_pod("freezeme", SLEEPER, restart="Always"))
    real_kube.wait_phase("freezeme", "Running", timeout=120)
    [pid] = real_kube.cluster.faults.stop("freezeme", real_kube.ns)
    real_kube.wait("the process to be stopped", lambda: read_proc_state(pid) == "T")
    real_kube.cluster.faults.cont("freezeme", real_kube.ns)
    real_kube.wait("the process to run again", lambda: read_proc_state(pid) in "RS")


def test_a_stopped_kubelet_makes_its_node_notready_and_its_pods_evicted(
    real_kube: Kube, node3: str
) -> None:
    real_kube.apply(real_pod("survivor", SLEEPER, node=node3, restart="Always"))
    real_kube.wait_phase("survivor", "Running", timeout=120)
    [pid] = real_kube.cluster.faults.stop("survivor", real_kube.ns)
    real_kube.cluster.faults.cont("survivor", real_kube.ns)
    real_kube.cluster.faults.node_notready(node3)
    config = real_kube.cluster.config
    grace = config.node_monitor_grace_seconds
    real_kube.wait(
        f"{node3} NotReady", lambda: not node_ready_untainted(real_kube, node3), grace + 30
    )
    # The node controller taints it NoExecute and evicts its pods after their toleration:
    # marked for deletion, which no kubelet confirms. The containers run on.
    real_kube.wait(
        "the pod evicted",
        lambda: (
            (real_kube.get("pod", "survivor") or {}).get("metadata", {}).get("deletionTimestamp")
        ),
        config.eviction_toleration_seconds + 30,
    )
    assert read_proc_state(pid) in "RS"
    real_kube.cluster.faults.node_ready(node3)
    real_kube.wait(f"{node3} Ready again", lambda: node_ready_untainted(real_kube, node3), 60)


def test_node_delete_removes_node_and_pods_and_node_add_registers_it(
    real_kube: Kube, node3: str
) -> None:
    real_kube.apply(real_pod("onnode3", SLEEPER, node=node3, restart="Always"))
    real_kube.wait_phase("onnode3", "Running", timeout=120)
    [pid] = real_kube.cluster.faults.stop("onnode3", real_kube.ns)
    real_kube.cluster.faults.node_delete(node3)
    real_kube.wait_gone("pod", "onnode3", timeout=60)
    assert real_kube.cluster.kubectl("get", "node", node3, check=False).returncode != 0
    assert not Path(f"/proc/{pid}").exists() or read_proc_state(pid) == "Z"
    real_kube.cluster.faults.node_add(node3)
    real_kube.wait(
        f"{node3} registered and Ready", lambda: node_ready_untainted(real_kube, node3), 90
    )


def test_evict_sets_disruption_target_then_the_kubelet_terminates(real_kube: Kube) -> None:
    script = (
        "import signal, sys, time\n"
        "def bye(signum, frame):\n"
        "    print('SIGTERM', flush=True)\n"
        "    time.sleep(3)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n"
    )
    real_kube.apply(real_pod("preempted", script, terminationGracePeriodSeconds=30))
    real_kube.wait_phase("preempted", "Running", timeout=120)
    real_kube.wait("the handler", lambda: "waiting" in real_kube.kubectl("logs", "preempted"))
    real_kube.cluster.faults.evict("preempted", real_kube.ns)
    pod = real_kube.wait_pod(
        "preempted",
        lambda p: condition(p, "DisruptionTarget") == "True",
        "DisruptionTarget",
        timeout=30,
    )
    assert pod["metadata"].get("deletionTimestamp")
    # Deadlines, not expectations: in CI this session's cluster runs at a low priority beside
    # the others (scripts/run-suites.sh), and a pod whose container had stopped was still
    # Terminating 33 s after the kubelet's Killing event. The kubelet must remove it within
    # the grace period (30 s) plus its own clean-up, however slowly that runs.
    real_kube.wait(
        "SIGTERM from the kubelet",
        lambda: "SIGTERM" in real_kube.kubectl("logs", "preempted", check=False),
        timeout=60,
    )
    real_kube.wait_gone("pod", "preempted", timeout=120)


def test_partition_cuts_peers_or_everything_and_heal_restores(real_kube: Kube) -> None:
    faults = real_kube.cluster.faults
    peer = server(real_kube, "peer", "node-2")
    other = server(real_kube, "other", "node-3")
    real_kube.apply(service("peer-svc", "peer"), real_pod("victim", SLEEPER, node="node-1"))
    real_kube.wait_ready("victim", timeout=120)
    peer_url = f"http://{peer['status']['podIP']}:8080/"
    other_url = f"http://{other['status']['podIP']}:8080/"
    urls = [peer_url, other_url, "http://peer-svc/"]
    real_kube.wait(
        "the victim to reach everything",
        lambda: all(v.startswith("OK") for v in fetch(real_kube, "victim", *urls).values()),
    )

    faults.partition("victim", real_kube.ns, "peers", allow=[other["status"]["podIP"]])
    got = fetch(real_kube, "victim", *urls)
    assert got[peer_url].startswith("FAIL"), got
    assert got[other_url].startswith("OK"), got  # allowed
    assert got["http://peer-svc/"].startswith("OK"), got  # Services stay reachable

    faults.partition("victim", real_kube.ns, "all")
    got = fetch(real_kube, "victim", *urls, "http://localhost:1/")
    assert all(v.startswith("FAIL") for v in got.values()), got

    faults.heal("victim", real_kube.ns)
    got = fetch(real_kube, "victim", *urls)
    assert all(v.startswith("OK") for v in got.values()), got
    victim = real_kube.get("pod", "victim")
    assert victim is not None
    assert victim["status"]["containerStatuses"][0]["restartCount"] == 0


def test_partition_and_heal_from_the_cli(real_kube: Kube) -> None:
    peer = server(real_kube, "clipeer", "node-2")
    real_kube.apply(real_pod("clivictim", SLEEPER, node="node-1"))
    real_kube.wait_ready("clivictim", timeout=120)
    url = f"http://{peer['status']['podIP']}:8080/"
    cut = devcluster_cli(real_kube, "fault", "partition", "clivictim", "-n", real_kube.ns)
    assert cut.returncode == 0, cut.stderr
    assert fetch(real_kube, "clivictim", url)[url].startswith("FAIL")
    healed = devcluster_cli(real_kube, "fault", "heal", "clivictim", "-n", real_kube.ns)
    assert healed.returncode == 0, healed.stderr
    assert fetch(real_kube, "clivictim", url)[url].startswith("OK")
