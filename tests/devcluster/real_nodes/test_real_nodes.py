"""Real nodes (kubelet + containerd + runc + CNI + kube-proxy): what the real kubelet shows."""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
import time
from datetime import UTC, datetime

import pytest

from devcluster.cluster import Cluster
from devcluster.imagebuild import BASE_IMAGE, PAUSE_IMAGE, operator_image, worker_image
from devcluster.nodes import real_nodes
from tests.support.kube import Kube, devcluster_cli, is_ready
from tests.support.real_pods import (
    SLEEPER,
    condition,
    fetch,
    node_objects,
    real_pod,
    server,
    service,
)

pytestmark = pytest.mark.devcluster

PROBE = (
    "import os, socket\n"
    "print('hostname', socket.gethostname())\n"
    "print('pid1', open('/proc/1/cmdline').read().replace(chr(0), ' ').strip())\n"
    "print('uid', os.getuid())\n"
    "print([l for l in open('/etc/os-release') if l.startswith('PRETTY_NAME')][0].strip())\n"
)


def test_nodes_are_real_kubelets_on_containerd_with_leases(real_kube: Kube) -> None:
    cfg = real_kube.cluster.config
    nodes = {n["metadata"]["name"]: n for n in node_objects(real_kube)}
    assert sorted(nodes) == cfg.node_names()
    for index, name in enumerate(cfg.node_names(), start=1):
        info = nodes[name]["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.20.2"
        assert info["containerRuntimeVersion"].startswith("containerd://")
        addresses = {a["type"]: a["address"] for a in nodes[name]["status"]["addresses"]}
        assert addresses["InternalIP"] == cfg.node_ip(index)
        assert condition(nodes[name], "Ready") == "True"
    real_kube.wait(
        "the kubelets to report the advertised GPUs as allocatable",
        lambda: all(
            n["status"]["allocatable"].get("nvidia.com/gpu") == "2" for n in node_objects(real_kube)
        ),
    )
    leases = json.loads(
        real_kube.cluster.kubectl("-n", "kube-node-lease", "get", "leases", "-o", "json").stdout
    )["items"]
    renewed = {item["spec"]["holderIdentity"]: item["spec"]["renewTime"] for item in leases}
    assert sorted(renewed) == cfg.node_names()
    for name, stamp in renewed.items():
        age = datetime.now(UTC) - datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert age.total_seconds() < 10, f"{name}'s Lease last renewed {age} ago"


def test_pods_run_in_containers_with_addresses_from_their_nodes(real_kube: Kube) -> None:
    cfg = real_kube.cluster.config
    names = {f"probe-{i}": node for i, node in enumerate(cfg.node_names(), start=1)}
    real_kube.apply(*[real_pod(pod, PROBE, node=node) for pod, node in names.items()])
    for pod, node in names.items():
        obj = real_kube.wait_phase(pod, "Succeeded", "Failed", timeout=120)
        assert obj["status"]["phase"] == "Succeeded", real_kube.dump()
        index = cfg.node_names().index(node) + 1
        ip = ipaddress.ip_address(obj["status"]["podIP"])
        assert ip in ipaddress.ip_network(cfg.realnet.pod_cidr(index))
        assert obj["status"]["hostIP"] == cfg.node_ip(index)
        for kind in ("PodScheduled", "Initialized"):
            assert condition(obj, kind) == "True"
        assert condition(obj, "Ready") == "False"  # completed: no longer ready
        logs = real_kube.kubectl("logs", pod).splitlines()
        assert f"hostname {pod}" in logs
        # PID 1 of the container's own PID namespace is the command itself.
        assert any(line.startswith("pid1 python3 -c") for line in logs), logs
        assert 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"' in logs
    events = json.loads(real_kube.kubectl("get", "events", "-o", "json"))["items"]
    kubelet_reasons = {
        e["reason"] for e in events if e.get("source", {}).get("component") == "kubelet"
    }
    assert {"Pulled", "Created", "Started"} <= kubelet_reasons, kubelet_reasons


def test_pods_services_and_dns_names_across_and_within_nodes(real_kube: Kube) -> None:
    ns = real_kube.ns
    far = server(real_kube, "far", "node-2")
    server(real_kube, "near", "node-1")
    real_kube.apply(
        service("far-svc", "far"),
        service("near-svc", "near"),
        service("far-headless", "far", port=8080, headless=True),
        real_pod("client", SLEEPER, node="node-1"),
    )
    real_kube.wait_ready("client", timeout=120)
    urls = [
        f"http://{far['status']['podIP']}:8080/",  # pod to pod across nodes
        "http://far-svc/",  # ClusterIP, endpoint on the other node
        "http://near-svc/",  # ClusterIP, endpoint on the same node
        f"http://far-svc.{ns}/",
        f"http://near-svc.{ns}.svc.cluster.local/",
        "http://far-headless:8080/",  # headless: the name is the pod's address
    ]

    def all_ok() -> dict[str, str] | None:
        got = fetch(real_kube, "client", *urls)
        return got if all(got.get(u, "").startswith("OK") for u in urls) else None

    got = real_kube.wait("every URL to answer from the client", all_ok, timeout=30)
    assert got[urls[0]] == "OK hello from far"
    assert got["http://near-svc/"] == "OK hello from near"
    assert got["http://far-headless:8080/"] == "OK hello from far"
    missing = fetch(real_kube, "client", f"http://nosuch.{ns}.svc.cluster.local/")
    assert "FAIL" in next(iter(missing.values()))


def test_the_host_reaches_pods_and_no_packet_for_services_or_pods_leaves(
    real_kube: Kube,
) -> None:
    cfg = real_kube.cluster.config
    pod = server(real_kube, "target", "node-3")
    with socket.create_connection((pod["status"]["podIP"], 8080), timeout=5):
        pass
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert f"unreachable {cfg.realnet.pod_range}" in routes
    assert f"unreachable {cfg.realnet.service_cidr}" in routes
    service_ip = str(ipaddress.ip_network(cfg.service_cidr)[200])
    unused_pod_ip = str(ipaddress.ip_network(cfg.realnet.pod_range)[-2])
    for address in (service_ip, unused_pod_ip, cfg.realnet.dns_service_ip):
        with pytest.raises(OSError) as refused:
            socket.create_connection((address, 80), timeout=5)
        assert refused.value.errno == errno.EHOSTUNREACH, (address, refused.value)


def test_kubectl_logs_follow_and_previous(real_kube: Kube) -> None:
    script = (
        "import os, sys, time\n"
        "first = not os.path.exists('/data/ran')\n"
        "open('/data/ran', 'w').close()\n"
        "if first:\n"
        "    print('first run', flush=True)\n"
        "    sys.exit(3)\n"
        "for i in range(1000):\n"
        "    print('tick', i, flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    real_kube.apply(
        real_pod(
            "logger",
            script,
            restart="Always",
            volumes=[{"name": "data", "emptyDir": {}}],
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
        )
    )
    pod = real_kube.wait_pod(
        "logger",
        lambda p: (
            bool(p["status"].get("containerStatuses"))
            and p["status"]["containerStatuses"][0]["restartCount"] >= 1
            and "running" in p["status"]["containerStatuses"][0]["state"]
        ),
        "restarted and running",
        timeout=120,
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 3
    assert real_kube.kubectl("logs", "logger", "--previous") == "first run\n"
    follow = subprocess.Popen(
        ["kubectl", "-n", real_kube.ns, "logs", "-f", "logger"],
        env=real_kube.cluster.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        seen = [follow.stdout.readline() for _ in range(8)]
    finally:
        follow.kill()
        follow.wait(timeout=10)
    numbers = [int(line.split()[1]) for line in seen]
    assert numbers == list(range(numbers[0], numbers[0] + 8)), seen


def test_exec_and_port_forward_go_through_the_kubelet(real_kube: Kube) -> None:
    server(real_kube, "web", "node-2")
    assert real_kube.kubectl("exec", "web", "--", "cat", "/etc/hostname").strip() == "web"
    forward = subprocess.Popen(
        ["kubectl", "-n", real_kube.ns, "port-forward", "pod/web", ":8080"],
        env=real_kube.cluster.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # Forwarding from 127.0.0.1:PORT -> 8080
        port = int(line.split("127.0.0.1:")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            conn.settimeout(10)
            reply = b""
            while chunk := conn.recv(4096):
                reply += chunk
        assert reply.endswith(b"hello from web"), reply
    finally:
        forward.kill()
        forward.wait(timeout=10)


def test_probes_and_conditions_come_from_the_kubelet(real_kube: Kube) -> None:
    script = "import time; time.sleep(4); open('/tmp/ready', 'w').close(); time.sleep(3600)"
    probe = {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1}
    real_kube.apply(real_pod("slow", script, restart="Always", readinessProbe=probe))
    pod = real_kube.wait_phase("slow", "Running", timeout=120)
    started = time.monotonic()
    assert condition(pod, "ContainersReady") == "False"
    pod = real_kube.wait_ready("slow", timeout=30)
    assert time.monotonic() - started < 20
    assert is_ready(pod) and condition(pod, "ContainersReady") == "True"


def test_real_cluster_status_and_logs_cli(real_cluster: Cluster, real_kube: Kube) -> None:
    real_kube.apply(real_pod("said", "print('from a real container')"))
    real_kube.wait_phase("said", "Succeeded", timeout=120)
    status = devcluster_cli(real_kube, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in real_cluster.config.node_names():
        assert f"{name}-kubelet" in status.stdout
    logs = devcluster_cli(real_kube, "logs", "said", "-n", real_kube.ns)
    assert logs.stdout == "from a real container\n", logs.stderr


def test_every_node_holds_every_image_under_the_name_pods_use(real_cluster: Cluster) -> None:
    """Each node's containerd imported every image archive under the name pods use, as the
    kubelet normalises it (the images themselves: test_images.py)."""
    images = {PAUSE_IMAGE, BASE_IMAGE, operator_image(), worker_image()}
    for node in real_nodes(real_cluster.config):
        listed = node.ctr("images", "ls", "-q")
        assert listed.returncode == 0, f"{node.name}: {listed.stderr}"
        assert images <= set(listed.stdout.split()), f"{node.name}: {listed.stdout}"
