"""``down`` of a real-node cluster leaves nothing behind, also after its processes were killed.

The test runs its own one-node cluster (not the session's), takes snapshots of what such a
cluster creates on the machine before ``up`` and after ``down`` (processes, network
namespaces, links, routes, root iptables rules, mounts, files at fixed paths, sysctls) and
compares them. Only what carries this cluster's names or addresses is compared: other
clusters may run beside it on the same machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import procs
from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig
from devcluster.nodeclean import KERNEL_TUNABLES, TUNABLES_DIR
from tests.support.cluster_fixtures import REAL_TEST_NET, missing_real_prereqs
from tests.support.kube import Kube, read_proc_state
from tests.support.real_pods import SLEEPER, real_pod

pytestmark = pytest.mark.devcluster


def _out(*argv: str) -> list[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return result.stdout.splitlines()


def snapshot(
    cfg: ClusterConfig, container_ids: set[str], pod_uids: set[str]
) -> dict[str, list[str]]:
    """What of this cluster exists on the machine now."""
    net = cfg.realnet
    octets = net.block.split(".")[:2]
    prefix = ".".join(octets) + "."
    run_dir = str(cfg.run_dir)
    found: dict[str, list[str]] = {}
    found["processes"] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            if read_proc_state(int(entry)) == "Z":
                continue  # dead, waiting for PID 1 to reap it
        except OSError:
            continue
        if run_dir in cmdline or procs.is_marked(int(entry), cfg.run_dir):
            found["processes"].append(f"{entry} {cmdline}")
        elif any(cid in cgroup for cid in container_ids):
            found["processes"].append(f"{entry} (container) {cmdline}")
    found["netns"] = [n for n in _out("ip", "netns", "list") if f"devcluster{cfg.net}-" in n]
    found["links"] = [
        line
        for line in _out("ip", "-o", "link")
        if f" {net.bridge}:" in line or f" {net.veth(1).rsplit('n', 1)[0]}n" in line
    ]
    found["routes"] = [r for r in _out("ip", "route", "show", "table", "all") if prefix in r]
    found["iptables"] = [r for r in _out("iptables-save") if prefix in r or net.bridge in r]
    # The host's mounts, and those of the nodes' own mount namespaces (seen through their
    # processes).
    mounts: set[str] = set()
    for pid in ["self", *map(str, procs.marked_pids(cfg.run_dir))]:
        try:
            mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        except OSError:
            continue
        mounts.update(" ".join(m.split()[3:5]) for m in mountinfo if run_dir in m)
    found["mounts"] = sorted(mounts)
    files = []
    for cid in container_ids:
        for node in cfg.node_names():
            sock = cfg.nodes_dir / node / "containerd" / "state" / "containerd.sock"
            key = hashlib.sha256(f"{sock}/k8s.io/{cid}".encode()).hexdigest()
            files += [str(p) for p in Path("/run/containerd/s").glob(key)]
        files += [str(p) for p in Path("/var/lib/cni/results").glob(f"*{cid}*")]
    for uid in pod_uids:  # the kubelets keep them in the run directory, never here
        files += [str(p) for p in Path("/var/log/pods").glob(f"*_{uid}")]
    found["files"] = files
    return found


def _tunables() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in KERNEL_TUNABLES}


@pytest.fixture
def one_node_cluster() -> Iterator[Cluster]:
    """A private one-node real cluster (its own net), always brought down."""
    problem = missing_real_prereqs()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    run_dir = Path(tempfile.mkdtemp(prefix="devcluster-real-test-down-"))
    cfg = ClusterConfig.private(run_dir, (REAL_TEST_NET + 1) % 220, runtime="containerd", nodes=1)
    cluster = Cluster(cfg)
    try:
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_down_after_a_crash_leaves_nothing_behind(one_node_cluster: Cluster) -> None:
    cluster = one_node_cluster
    cfg = cluster.config
    others = (TUNABLES_DIR / "kernel-tunables.json").exists()  # another cluster runs kubelets
    before_tunables = _tunables()
    assert snapshot(cfg, set(), set()) == {k: [] for k in snapshot(cfg, set(), set())}
    cluster.up(timeout=600)
    kube = Kube(cluster, "default")
    kube.wait(
        "the default ServiceAccount", lambda: (kube.get("sa", "default") or {}).get("secrets")
    )
    kube.apply(real_pod("leftover", SLEEPER, restart="Always"))
    pod = kube.wait_ready("leftover", timeout=120)
    ids = {s["containerID"].split("//")[1] for s in pod["status"]["containerStatuses"]}
    sandboxes = Path(
        cfg.nodes_dir
        / "node-1"
        / "containerd"
        / "state"
        / "io.containerd.runtime.v2.task"
        / "k8s.io"
    )
    ids |= {p.name for p in sandboxes.iterdir()}
    uids = {pod["metadata"]["uid"]}
    during = snapshot(cfg, ids, uids)
    for kind in ("processes", "netns", "links", "routes", "mounts", "files"):
        assert during[kind], f"nothing of kind {kind} while the cluster runs: the check is blind"
    # A crash: every process of the cluster dies at once; containers, mounts and the
    # network stay. down must still remove it all.
    procs.signal_pids(procs.marked_pids(cfg.run_dir), signal.SIGKILL)
    cluster.down()
    assert snapshot(cfg, ids, uids) == {k: [] for k in during}, json.dumps(
        snapshot(cfg, ids, uids), indent=1
    )
    if not others:
        assert _tunables() == before_tunables
