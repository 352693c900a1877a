"""A test's namespace on a devcluster, reached with kubectl: manifests, waits with deadlines,
dumps; and devcluster's own CLI against the cluster."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from devcluster.cluster import Cluster
from devcluster.config import REPO_ROOT
from tests.support.pod_exits import PodExits

Obj = dict[str, Any]


_READ_IN_PROCESS = {
    "ej": "/apis/elasticjob.dev/v1alpha1/namespaces/{ns}/elasticjobs/{name}",
    "pod": "/api/v1/namespaces/{ns}/pods/{name}",
    "serviceaccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    "secret": "/api/v1/namespaces/{ns}/secrets/{name}",
    "configmap": "/api/v1/namespaces/{ns}/configmaps/{name}",
    "service": "/api/v1/namespaces/{ns}/services/{name}",
    "pdb": "/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets/{name}",
    "netpol": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}",
}
"""The kinds :meth:`Kube.get` reads in-process, and where (kubectl costs ~40 ms of CPU and a
few hundred ms under load a call, the client a few ms): tests poll them, and every test's
namespace waits for its ServiceAccount."""


@functools.cache
def _api_client(kubeconfig: str) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=config
    )
    return kubernetes.client.ApiClient(config)


class WaitTimeout(AssertionError):
    """A wait ran past its deadline; the message holds a dump of the namespace."""


def pod_manifest(
    name: str,
    script: str,
    *,
    image: str = "python:3.11",
    restart: str = "Never",
    env: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    """A single-container pod running ``python -c script``."""
    container: Obj = {"name": "main", "image": image, "command": ["python", "-c", script]}
    if env:
        container["env"] = env
    for key in ("readinessProbe", "livenessProbe", "volumeMounts", "ports"):
        if key in spec:
            container[key] = spec.pop(key)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {"restartPolicy": restart, "containers": [container], **spec},
    }


class Kube:
    """kubectl bound to one test namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    # ----- commands ------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run kubectl in the namespace; return stdout."""
        result = self.cluster.kubectl("-n", self.ns, *args, input=input, check=False)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result.stdout

    def apply(self, *manifests: Obj) -> None:
        """kubectl apply the manifests."""
        text = yaml.safe_dump_all(list(manifests))
        self.kubectl("apply", "-f", "-", input=text)

    def get(self, kind: str, name: str) -> Obj | None:
        """The object, or None if it does not exist (read in-process for the kinds of
        :data:`_READ_IN_PROCESS`, with kubectl for the others)."""
        if kind in _READ_IN_PROCESS:
            return self._read(kind, name)
        result = self.cluster.kubectl("-n", self.ns, "get", kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {result.stderr}")
        obj: Obj = json.loads(result.stdout)
        return obj

    def _client(self) -> kubernetes.client.ApiClient:
        """The in-process API client of this cluster (one per kubeconfig)."""
        return _api_client(str(self.cluster.kubeconfig))

    def pod_exits(self, namespace: str, selector: str) -> PodExits:
        """Start watching how the pods of ``selector`` in ``namespace`` end."""
        return PodExits(self._core(), namespace, selector).start()

    def _core(self) -> Any:
        """The core API (pods, namespaces, logs) through :meth:`_client`."""
        return kubernetes.client.CoreV1Api(self._client())

    def _read(self, kind: str, name: str) -> Obj | None:
        client = self._client()
        path = _READ_IN_PROCESS[kind].format(ns=self.ns, name=name)
        request: Any = client.param_serialize("GET", path, auth_settings=["BearerToken"])
        method, url, headers, body, post = request
        response: Any = client.call_api(
            method, url, header_params=headers, body=body, post_params=post
        )
        data = response.read()
        if response.status == 404:
            return None
        if response.status != 200:
            raise AssertionError(f"GET {path}: {response.status} {data[:500]!r}")
        obj: Obj = json.loads(data)
        return obj

    def logs(self, pod: Obj) -> str:
        """The logs of every container of ``pod`` (``kubectl logs --all-containers``), read
        in-process; a container with no log to read (not started, its pod gone) adds none."""
        core = self._core()
        spec = pod.get("spec", {})
        texts = []
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            try:
                found = core.read_namespaced_pod_log(
                    pod["metadata"]["name"],
                    self.ns,
                    container=container["name"],
                    _preload_content=False,
                )
            except ApiException:
                continue
            texts.append(found.data.decode(errors="replace"))
        return "".join(texts)

    def delete_jobs_and_pods(self) -> None:
        """Delete every ElasticJob of the namespace (not waiting) and every pod at once, with
        no grace period (``kubectl delete ... --all``, in-process)."""
        custom: Any = kubernetes.client.CustomObjectsApi(self._client())
        custom.delete_collection_namespaced_custom_object(
            "elasticjob.dev", "v1alpha1", self.ns, "elasticjobs"
        )
        self._core().delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)

    def create_namespace(self) -> None:
        """Create this namespace (in-process)."""
        self._core().create_namespace({"metadata": {"name": self.ns}})

    def delete_namespace(self) -> None:
        """Delete this namespace without waiting for it to go (in-process); gone already is
        fine."""
        try:
            self._core().delete_namespace(self.ns)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def pods(self, selector: str) -> list[Obj]:
        """Pods matching a label selector (read in-process: tests poll them)."""
        found = self._core().list_namespaced_pod(
            self.ns, label_selector=selector, _preload_content=False
        )
        items: list[Obj] = json.loads(found.data)["items"]
        return items

    # ----- waits ---------------------------------------------------------
    def wait(
        self,
        what: str,
        check: Callable[[], Any],
        timeout: float = 30.0,
        explain: Callable[[], str] | None = None,
    ) -> Any:
        """Poll ``check`` until it returns something truthy; dump the namespace (and what
        ``explain`` says) on timeout."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                said = "" if explain is None else f"{explain()}\n"
                raise WaitTimeout(
                    f"timed out after {timeout:g} s waiting for {what}\n{said}{self.dump()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def wait_pod(
        self, name: str, check: Callable[[Obj], bool], what: str, timeout: float = 30.0
    ) -> Obj:
        """Wait until pod ``name`` exists and ``check(pod)`` holds; return the pod."""

        def probe() -> Obj | None:
            pod = self.get("pod", name)
            return pod if pod is not None and check(pod) else None

        result: Obj = self.wait(f"pod {name} {what}", probe, timeout)
        return result

    def wait_phase(self, name: str, *phases: str, timeout: float = 30.0) -> Obj:
        """Wait until the pod is in one of ``phases``."""
        return self.wait_pod(
            name,
            lambda p: p.get("status", {}).get("phase") in phases,
            f"phase in {phases}",
            timeout,
        )

    def wait_ready(self, name: str, timeout: float = 30.0) -> Obj:
        """Wait until the pod's Ready condition is True."""
        return self.wait_pod(name, is_ready, "Ready", timeout)

    def wait_gone(self, kind: str, name: str, timeout: float = 30.0) -> None:
        """Wait until the object no longer exists."""
        self.wait(f"{kind} {name} to disappear", lambda: self.get(kind, name) is None, timeout)

    # ----- diagnostics ---------------------------------------------------
    def disk_log(self, pod: str, container: str = "main") -> str:
        """The latest log of a container, read from the agent's disk (also after deletion)."""
        dirs = sorted(
            self.cluster.config.pods_dir.glob(f"{self.ns}_{pod}_*/logs/{container}"),
            key=lambda p: p.stat().st_mtime,
        )
        if not dirs:
            return ""
        runs = sorted(dirs[-1].glob("*.log"), key=lambda p: int(p.stem))
        return runs[-1].read_text(errors="replace") if runs else ""

    def dump(self) -> str:
        """Pods, events and logs of the namespace, plus the agent's (or kubelets') log tail."""
        parts = []
        for args in (("get", "pods", "-o", "wide"), ("get", "events", "--sort-by=.lastTimestamp")):
            try:
                result = self.cluster.kubectl("-n", self.ns, *args, check=False, timeout=20)
                parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout}{result.stderr}")
            except subprocess.TimeoutExpired:
                parts.append(f"$ kubectl {' '.join(args)}: timed out")
        logs_root, logs = pod_log_files(self.cluster, self.ns)
        for log in logs:
            text = log.read_text(errors="replace")[-2000:]
            parts.append(f"--- {log.relative_to(logs_root)}\n{text}")
        for component in [c for c in self.cluster.components() if c.endswith("-kubelet")] or [
            "agent"
        ]:
            parts.append(f"--- {component} log (tail)\n" + self.cluster.log_tail(component, 20))
        return "\n".join(parts)


def pod_log_files(cluster: Cluster, namespace: str, pod: str = "*") -> tuple[Path, list[Path]]:
    """The container log files of the namespace's pods (``pod``: a name or a glob), sorted,
    and the directory they lie under: the agent's pod directories on process nodes, each
    node's /var/log/pods on real nodes (readable even while the node's kubelet is down)."""
    cfg = cluster.config
    root, pattern = cfg.pods_dir, f"{namespace}_{pod}_*/logs/*/*.log"
    if cfg.real:
        root, pattern = cfg.nodes_dir, f"*/logs/pods/{namespace}_{pod}_*/*/*.log"
    return root, sorted(root.glob(pattern))


def node_ready_untainted(kube: Kube, node: str) -> bool:
    """The node exists, is Ready and carries no ``node.kubernetes.io/`` taint."""
    obj = kube.cluster.kubectl("get", "node", node, "-o", "json", check=False)
    if obj.returncode != 0:
        return False
    data = json.loads(obj.stdout)
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in data["status"]["conditions"]
    )
    tainted = any(
        t["key"].startswith("node.kubernetes.io/") for t in data["spec"].get("taints", [])
    )
    return ready and not tainted


def is_ready(pod: Obj) -> bool:
    """True if the pod's Ready condition is True."""
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return bool(cond["status"] == "True")
    return False


def container_state(pod: Obj, name: str = "main") -> Obj:
    """``state`` of a container (empty if not reported yet)."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status["name"] == name:
            state: Obj = status["state"]
            return state
    return {}


def read_proc_state(pid: int) -> str:
    """The one-letter state of a process (R, S, T, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def devcluster_cli(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m devcluster ARGS`` against the cluster of ``kube``."""
    return subprocess.run(
        [sys.executable, "-m", "devcluster", "--run-dir", str(kube.cluster.config.run_dir), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
