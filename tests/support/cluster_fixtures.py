"""The devcluster fixtures of the suites that need a cluster (tests/devcluster and tests/e2e
import them in their conftest): one devcluster per test session, a fresh namespace per test.

The cluster runs from its own run directory with free ports, so it does not
collide with a developer's ``python -m devcluster up``. ``real_cluster`` (and ``real_kube``)
is the same on real nodes (``runtime="containerd"``: kubelets, containerd, CNI, kube-proxy).
It is always torn down (also on Ctrl-C), leaving no process behind. The Kubernetes binaries
must have been built once (``bash scripts/devcluster-prereqs.sh``); without them the tests
that need the cluster fail under CI and are skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import procs
from devcluster.build import BuildError, cached_helm, cached_kubernetes, find_node_binaries
from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig, default_cache_dir
from tests.support.kube import Kube

#: Second octet of this session's node and pod addresses (127.<net>.<node>.<pod>);
#: varies per session so that concurrent sessions on one machine do not collide.
TEST_NET = int(os.environ.get("DEVCLUSTER_TEST_NET", str(20 + os.getpid() % 200)))
#: ``net`` of the session's real-node cluster (its addresses are 10.<16 + net>.x.y).
REAL_TEST_NET = int(os.environ.get("DEVCLUSTER_REAL_TEST_NET", str((TEST_NET + 97) % 220)))
REAL_PREFIX = "devcluster-real-test-"


def _missing_prereqs() -> str | None:
    cache = default_cache_dir()
    if cached_kubernetes(cache) is None or cached_helm(cache) is None:
        return (
            f"devcluster binaries are not built in {cache}: "
            "run `bash scripts/devcluster-prereqs.sh`"
        )
    for tool in ("etcd", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (see scripts/devcluster-prereqs.sh)"
    return None


def _running(cfg: ClusterConfig, up_timeout: float) -> Iterator[Cluster]:
    """The cluster of ``cfg`` up; down and its run directory removed afterwards."""
    c = Cluster(cfg)
    try:
        c.up(timeout=up_timeout)
        yield c
    finally:
        c.down()
        shutil.rmtree(cfg.run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def process_cluster() -> Iterator[Cluster]:
    """A running devcluster on process nodes (4 nodes, one with 2 nvidia.com/gpu), torn down
    at the end."""
    problem = _missing_prereqs()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    for stale in Path(tempfile.gettempdir()).glob("devcluster-test-*"):
        # Left by a session that was killed; its agent already stopped its processes.
        if not procs.marked_pids(stale):
            shutil.rmtree(stale, ignore_errors=True)
    run_dir = Path(tempfile.mkdtemp(prefix="devcluster-test-"))
    cfg = ClusterConfig.private(
        run_dir,
        TEST_NET,
        nodes=4,
        extended_resources={"nvidia.com/gpu": "2"},
        owner_pid=os.getpid(),
    )
    yield from _running(cfg, up_timeout=120)


def _left_behind(run_dir: Path) -> bool:
    """Whether the real-node cluster of ``run_dir`` was left by a session that ended: none of
    its processes and not its owner (the session, which may still be starting it) alive."""
    if procs.marked_pids(run_dir) or not (run_dir / "config.json").exists():
        return False
    owner = ClusterConfig.load(run_dir).owner_pid
    return owner is None or not procs.alive(owner)


def missing_real_prereqs() -> str | None:
    problem = _missing_prereqs()
    if problem:
        return problem
    if os.geteuid() != 0:
        return "real nodes need root (network namespaces, containerd, mounts)"
    try:
        find_node_binaries(default_cache_dir(), build=False)
    except BuildError as err:
        return str(err)
    return None


@pytest.fixture(scope="session")
def cluster(process_cluster: Cluster) -> Cluster:
    """The cluster of the devcluster suite: process nodes (the e2e suite overrides it)."""
    return process_cluster


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Cluster]:
    """A running devcluster on real nodes (3 kubelets on containerd, each advertising 2
    nvidia.com/gpu), torn down at the end."""
    problem = missing_real_prereqs()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    for stale in Path(tempfile.gettempdir()).glob(f"{REAL_PREFIX}*"):
        # Left by a session that was killed: stop what it left and remove its network. (Not
        # a cluster another session is starting, whose processes are not up yet.)
        if _left_behind(stale):
            Cluster.from_run_dir(stale).down()
            shutil.rmtree(stale, ignore_errors=True)
    run_dir = Path(tempfile.mkdtemp(prefix=REAL_PREFIX))
    cfg = ClusterConfig.private(
        run_dir,
        REAL_TEST_NET,
        runtime="containerd",
        extended_resources={"nvidia.com/gpu": "2"},
        owner_pid=os.getpid(),
    )
    yield from _running(cfg, up_timeout=600)


def _namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())
    ns = f"{base[:40].strip('-')}-{uuid.uuid4().hex[:5]}"
    kube = Kube(cluster, ns)
    kube.create_namespace()
    kube.wait(
        f"the default ServiceAccount of {ns} with its token",
        lambda: (kube.get("serviceaccount", "default") or {}).get("secrets"),
        timeout=30,
    )
    yield kube
    kube.delete_namespace()


@pytest.fixture
def kube(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """A fresh namespace of the process-node cluster for one test."""
    yield from _namespace(cluster, request)


@pytest.fixture
def real_kube(real_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """A fresh namespace of the real-node cluster for one test."""
    yield from _namespace(real_cluster, request)
