"""The operator's Helm chart: ``helm lint`` and ``helm template`` checked against the contract
between the chart and the operator process (no cluster needed).

The tests use the helm binary that ``scripts/devcluster-prereqs.sh`` caches; without it they
fail (they are never skipped). That prerequisite puts them with the end-to-end tests, which
install the chart, rather than with the unit tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.build import cached_helm
from devcluster.config import default_cache_dir
from elasticjob.operator.api import LABEL_ROLE, ROLE_WORKER
from tests.support.reference_docs import (
    RELEASE_NAMESPACE,
    rbac_table,
    served_metrics,
    table_in,
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "elasticjob-operator"
CRD = REPO / "deploy" / "crds" / "elasticjob.dev_elasticjobs.yaml"
CHART_CRD = CHART / "crds" / CRD.name
PREREQS = "scripts/devcluster-prereqs.sh"
EXAMPLE = "examples/elasticjob.yaml"

RELEASE = "ej"
NAMESPACE = "elasticjob-system"
FULLNAME = "ej-elasticjob-operator"
SERVICE_ACCOUNT = FULLNAME
APP_VERSION = "0.1.0"
#: Seconds any helm command may take.
TIMEOUT = 60

Manifest = dict[str, Any]
#: (apiGroup, resource) -> verbs.
Grants = dict[tuple[str, str], set[str]]

JOB_GRANTS: Grants = {
    ("elasticjob.dev", "elasticjobs"): {"get", "list", "watch", "patch", "update", "delete"},
    ("elasticjob.dev", "elasticjobs/status"): {"get", "list", "watch", "patch", "update"},
    ("elasticjob.dev", "elasticjobs/scale"): {"get", "list", "watch", "patch", "update"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "secrets"): {"get", "create", "patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("policy", "poddisruptionbudgets"): {"create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"create", "patch"},
    ("", "configmaps"): {"get", "create", "patch"},
}
CLUSTER_GRANTS: Grants = {
    ("", "nodes"): {"get", "list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
}
WEBHOOK = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
# kopf manages both kinds of webhook configuration (the mutating one stays empty).
WEBHOOK_GRANTS: Grants = {
    kind: {"get", "list", "watch", "create", "patch", "update"} for kind in (WEBHOOK, MUTATING)
}
# The ClusterRole that owns the webhook configurations: the operator reads its uid.
OWNER_GRANTS: Grants = {("rbac.authorization.k8s.io", "clusterroles"): {"get"}}
LABELS = {
    "app.kubernetes.io/name": "elasticjob-operator",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": APP_VERSION,
    "app.kubernetes.io/managed-by": "Helm",
    "helm.sh/chart": f"elasticjob-operator-{APP_VERSION}",
}
SELECTOR = {"app.kubernetes.io/name": "elasticjob-operator", "app.kubernetes.io/instance": RELEASE}
RENDEZVOUS_URL = f"https://{FULLNAME}.{NAMESPACE}.svc:8470"
TLS_SECRET = f"{FULLNAME}-rendezvous-tls"
SELF_ROLE = f"{FULLNAME}-self"
"""The Role that lets the operator read its own pod (it stops once the pod is being deleted)."""
TLS_ARGS = ["--rendezvous-tls-secret", TLS_SECRET]
REPLICAS_SERVICE = f"{FULLNAME}-replicas"
"""The Service in front of every ready replica (admission reviews, metrics)."""
LEASE = f"{FULLNAME}-leader"
WEBHOOK_TLS_SECRET = f"{FULLNAME}-webhook-tls"
ELECTION_ARGS = [
    "--leader-election-lease",
    LEASE,
    "--lease-duration",
    "3",
    "--renew-deadline",
    "2",
    "--retry-period",
    "0.5",
]
WEBHOOK_ARGS = [
    "--webhook",
    "--webhook-service",
    REPLICAS_SERVICE,
    "--webhook-tls-secret",
    WEBHOOK_TLS_SECRET,
]
SELF_GRANTS: Grants = {
    ("", "pods"): {"get"},
    ("discovery.k8s.io", "endpointslices"): {"create", "get", "update"},
    ("coordination.k8s.io", "leases"): {"create", "get", "update"},
    ("", "events"): {"create"},
}
# The operator reads and fills the Secret that keeps the rendezvous certificate it makes.
TLS_GRANTS: Grants = {("", "secrets"): {"get", "patch"}}


class Helm:
    """The cached helm binary, run with its own empty config and no cluster."""

    def __init__(self, binary: Path | None, home: Path) -> None:
        self.binary = binary
        self.home = home
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "KUBECONFIG": str(home / "no-kubeconfig"),
        }
        self._rendered: dict[str, list[Manifest]] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``helm ARGS``, failing the test when helm is not cached."""
        if self.binary is None:
            pytest.fail(
                f"no helm binary is cached in {default_cache_dir()}: "
                f"run `bash {PREREQS}` once (it caches helm for these tests and devcluster)",
                pytrace=False,
            )
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT,
            check=False,
        )

    def values_file(self, values: Mapping[str, Any]) -> str:
        """A values file holding ``values`` (YAML keeps their types, unlike ``--set``)."""
        path = self.home / f"values-{uuid.uuid4().hex}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return str(path)

    def template_result(
        self, values: Mapping[str, Any] | None = None, *extra: str, release: str = RELEASE
    ) -> subprocess.CompletedProcess[str]:
        """``helm template`` of the chart, as a completed process."""
        args = ["template", release, str(CHART), "--namespace", NAMESPACE, *extra]
        if values:
            args += ["--values", self.values_file(values)]
        return self.run(*args)

    def template(
        self, values: Mapping[str, Any] | None = None, *extra: str, release: str = RELEASE
    ) -> list[Manifest]:
        """The objects ``helm template`` renders; the call must succeed."""
        key = json.dumps([values, extra, release], sort_keys=True)
        if key not in self._rendered:
            result = self.template_result(values, *extra, release=release)
            assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
            docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
            assert all(isinstance(doc, dict) for doc in docs), result.stdout
            self._rendered[key] = docs
        return self._rendered[key]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(cached_helm(default_cache_dir()), tmp_path_factory.mktemp("helm"))


# --- helpers ---------------------------------------------------------------------------------


def named(
    objects: Iterable[Manifest], kind: str, name: str, namespace: str | None = None
) -> Manifest:
    """The one rendered object of that kind, name and namespace."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"{len(found)} {kind} {namespace}/{name} rendered"
    return found[0]


def of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def identities(objects: Iterable[Manifest]) -> set[tuple[str, str, str | None]]:
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}


def container(objects: Iterable[Manifest]) -> Manifest:
    """The operator container of the Deployment."""
    deployment = named(objects, "Deployment", FULLNAME, NAMESPACE)
    containers: list[Manifest] = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def container_ports(c: Manifest) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def env_of(c: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def grants(role: Manifest) -> Grants:
    """The verbs a (Cluster)Role grants per (apiGroup, resource)."""
    result: Grants = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


def all_grants(roles: Iterable[Manifest]) -> Grants:
    result: Grants = {}
    for role in roles:
        for key, verbs in grants(role).items():
            result.setdefault(key, set()).update(verbs)
    return result


def chart_metadata() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return data


# --- lint ------------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
@pytest.mark.parametrize(
    "values",
    [
        {},
        {"watchNamespaces": ["a", "b"], "webhook": {"enabled": False}, "rbac": {"create": False}},
        {"rendezvous": {"tls": {"enabled": True, "secretName": "rdzv-cert"}}},
        {"rendezvous": {"tls": {"enabled": False}}, "networkPolicy": {"enabled": False}},
    ],
    ids=["defaults", "namespaced", "tls-provided", "plain"],
)
def test_helm_lint_passes(helm: Helm, strict: bool, values: dict[str, Any]) -> None:
    args = ["lint", str(CHART), "--namespace", NAMESPACE]
    if strict:
        args.append("--strict")
    if values:
        args += ["--values", helm.values_file(values)]
    result = helm.run(*args)
    assert result.returncode == 0, f"helm lint failed:\n{result.stdout}\n{result.stderr}"
    assert "0 chart(s) failed" in result.stdout


def test_chart_metadata_matches_the_project() -> None:
    chart = chart_metadata()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "elasticjob-operator"
    assert chart["appVersion"] == APP_VERSION == project["version"]


# --- what is rendered --------------------------------------------------------------------------


def test_defaults_render_the_expected_objects(helm: Helm) -> None:
    objects = helm.template()
    assert identities(objects) == {
        ("ServiceAccount", FULLNAME, NAMESPACE),
        ("ClusterRole", f"{FULLNAME}-cluster", None),
        ("ClusterRoleBinding", f"{FULLNAME}-cluster", None),
        ("ClusterRole", FULLNAME, None),
        ("ClusterRoleBinding", FULLNAME, None),
        ("Service", FULLNAME, NAMESPACE),
        ("Service", REPLICAS_SERVICE, NAMESPACE),
        ("Deployment", FULLNAME, NAMESPACE),
        ("PodDisruptionBudget", FULLNAME, NAMESPACE),
        ("Secret", TLS_SECRET, NAMESPACE),
        ("Role", TLS_SECRET, NAMESPACE),
        ("RoleBinding", TLS_SECRET, NAMESPACE),
        ("Secret", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("Role", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("RoleBinding", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("Role", SELF_ROLE, NAMESPACE),
        ("RoleBinding", SELF_ROLE, NAMESPACE),
        ("NetworkPolicy", FULLNAME, NAMESPACE),
    }


def test_the_crd_comes_only_from_crds_and_no_webhook_configuration_is_rendered(
    helm: Helm,
) -> None:
    kinds = {o["kind"] for o in helm.template()}
    assert "CustomResourceDefinition" not in kinds
    assert not kinds & {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
    with_crds = helm.template(None, "--include-crds")
    crds = of_kind(with_crds, "CustomResourceDefinition")
    assert crds == [yaml.safe_load(CRD.read_text())]


@pytest.mark.parametrize(
    ("release", "values", "fullname"),
    [
        ("elasticjob-operator", {}, "elasticjob-operator"),
        ("my-elasticjob-operator", {}, "my-elasticjob-operator"),
        ("ej", {"fullnameOverride": "ejo"}, "ejo"),
        ("ej", {"nameOverride": "op"}, "ej-op"),
    ],
)
def test_object_names_follow_the_release(
    helm: Helm, release: str, values: dict[str, Any], fullname: str
) -> None:
    objects = helm.template(values, release=release)
    deployment = named(objects, "Deployment", fullname, NAMESPACE)
    named(objects, "Service", fullname, NAMESPACE)
    named(objects, "ClusterRole", f"{fullname}-cluster")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["ELASTICJOB_RENDEZVOUS_URL"] == f"https://{fullname}.{NAMESPACE}.svc:8470"
    assert env["ELASTICJOB_SERVICE_NAME"] == fullname


def test_every_object_carries_the_helm_labels_and_selectors_agree(helm: Helm) -> None:
    objects = helm.template()
    for o in objects:
        labels = o["metadata"]["labels"]
        assert labels.items() >= LABELS.items(), f"{o['kind']} {o['metadata']['name']}"
    deployment = named(objects, "Deployment", FULLNAME, NAMESPACE)
    assert deployment["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= SELECTOR.items()
    rendezvous = named(objects, "Service", FULLNAME, NAMESPACE)
    assert "selector" not in rendezvous["spec"], "the leader writes its EndpointSlice"
    assert named(objects, "Service", REPLICAS_SERVICE, NAMESPACE)["spec"]["selector"] == SELECTOR
    budget = named(objects, "PodDisruptionBudget", FULLNAME, NAMESPACE)
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}


# --- the operator container ----------------------------------------------------------------


def test_container_matches_the_operator_contract(helm: Helm) -> None:
    c = container(helm.template())
    assert c["image"] == f"elasticjob/operator:{chart_metadata()['appVersion']}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["elasticjob-operator"]
    assert c["args"] == ["--log-level", "info", *ELECTION_ARGS, *WEBHOOK_ARGS, *TLS_ARGS]
    env = env_of(c)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["ELASTICJOB_RENDEZVOUS_URL"] == RENDEZVOUS_URL
    assert env["ELASTICJOB_WEBHOOK_OWNER"] == f"{FULLNAME}-cluster"
    assert container_ports(c) == {
        "rendezvous": 8470,
        "metrics": 8471,
        "health": 8472,
        "webhook": 8443,
    }
    assert all(p["protocol"] == "TCP" for p in c["ports"])
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz"
        port = get["port"] if isinstance(get["port"], int) else container_ports(c)[get["port"]]
        assert port == 8472, probe  # kopf's liveness endpoint (main.py --liveness-port)


def test_pod_runs_locked_down(helm: Helm) -> None:
    objects = helm.template()
    deployment = named(objects, "Deployment", FULLNAME, NAMESPACE)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    c = container(objects)
    assert c["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    # With a read-only root filesystem, temporary files go to an emptyDir.
    tmpdir = env_of(c)["TMPDIR"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts[tmpdir]]


def test_pod_security_context_matches_the_operator_image(helm: Helm) -> None:
    """The chart runs the image's own user and group (Dockerfile.operator: useradd 10001 with
    group 10001), under the runtime's default seccomp profile."""
    dockerfile = (REPO / "Dockerfile.operator").read_text()
    (user,) = re.findall(r"^USER (\d+)$", dockerfile, re.MULTILINE)
    (gid,) = re.findall(r"useradd .*--gid (\d+)", dockerfile)
    pod = named(helm.template(), "Deployment", FULLNAME, NAMESPACE)["spec"]["template"]["spec"]
    context = pod["securityContext"]
    assert context["runAsUser"] == int(user)
    assert context["runAsGroup"] == context["fsGroup"] == int(gid)
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_values_reach_the_pod(helm: Helm) -> None:
    values: dict[str, Any] = {
        "image": {"repository": "registry.example/elasticjob/operator", "tag": "1.2.3"},
        "logLevel": "debug",
        "replicas": 0,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"prometheus.io/port": "8471"},
        "imagePullSecrets": [{"name": "pull"}],
    }
    objects = helm.template(values)
    deployment = named(objects, "Deployment", FULLNAME, NAMESPACE)
    assert deployment["spec"]["replicas"] == 0
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == "1.2.3"
    pod = deployment["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == values[key], key
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    assert deployment["spec"]["template"]["metadata"]["annotations"] == values["podAnnotations"]
    c = container(objects)
    assert c["image"] == "registry.example/elasticjob/operator:1.2.3"
    assert c["args"][:2] == ["--log-level", "debug"]
    assert c["resources"] == values["resources"]


def service_ports(objects: list[Manifest], name: str) -> dict[str, tuple[int, int]]:
    service = named(objects, "Service", name, NAMESPACE)
    assert service["spec"]["type"] == "ClusterIP"
    targets = container_ports(container(objects))
    return {
        p["name"]: (p["port"], targets.get(p["targetPort"], p["targetPort"]))
        for p in service["spec"]["ports"]
    }


def test_services_expose_the_leaders_rendezvous_and_every_replicas_metrics_and_webhook(
    helm: Helm,
) -> None:
    objects = helm.template()
    assert service_ports(objects, FULLNAME) == {"rendezvous": (8470, 8470)}
    # The leader routes the workers: it makes and writes the Service's EndpointSlice (a chart's
    # slice would be claimed by Helm's server-side apply, and an upgrade would conflict).
    assert not of_kind(objects, "EndpointSlice")
    assert service_ports(objects, REPLICAS_SERVICE) == {
        "metrics": (8471, 8471),
        "webhook": (443, 8443),
    }


def test_replicas_prefer_different_nodes_unless_an_affinity_is_given(helm: Helm) -> None:
    pod = named(helm.template(), "Deployment", FULLNAME, NAMESPACE)["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": SELECTOR},
    }


@pytest.mark.parametrize(
    "values",
    [{"replicas": 1}, {"podDisruptionBudget": {"enabled": False}}],
    ids=["one-replica", "disabled"],
)
def test_no_disruption_budget_for_one_replica_or_when_disabled(
    helm: Helm, values: dict[str, Any]
) -> None:
    assert not of_kind(helm.template(values), "PodDisruptionBudget")


def test_the_per_job_network_policy_is_on_unless_switched_off(helm: Helm) -> None:
    assert "--no-worker-network-policy" not in container(helm.template({}))["args"]
    args = container(helm.template({"workerNetworkPolicy": {"enabled": False}}))["args"]
    assert "--no-worker-network-policy" in args


def test_the_election_timing_reaches_the_operator(helm: Helm) -> None:
    values = {
        "leaderElection": {
            "leaseDurationSeconds": 15,
            "renewDeadlineSeconds": 10,
            "retryPeriodSeconds": 2,
        }
    }
    args = container(helm.template(values))["args"]
    at = args.index("--leader-election-lease")
    assert args[at : at + 8] == [
        "--leader-election-lease",
        LEASE,
        "--lease-duration",
        "15",
        "--renew-deadline",
        "10",
        "--retry-period",
        "2",
    ]


def test_webhook_disabled_drops_flag_port_and_rbac(helm: Helm) -> None:
    objects = helm.template({"webhook": {"enabled": False}})
    c = container(objects)
    assert c["args"] == ["--log-level", "info", *ELECTION_ARGS, *TLS_ARGS]
    assert "webhook" not in container_ports(c)
    assert "ELASTICJOB_WEBHOOK_OWNER" not in env_of(c)
    assert list(service_ports(objects, REPLICAS_SERVICE)) == ["metrics"]
    assert ("Secret", WEBHOOK_TLS_SECRET, NAMESPACE) not in identities(objects)
    cluster = grants(named(objects, "ClusterRole", f"{FULLNAME}-cluster"))
    assert cluster == CLUSTER_GRANTS


# --- RBAC ------------------------------------------------------------------------------------


def assert_least_privilege(objects: Iterable[Manifest]) -> None:
    for role in [*of_kind(objects, "ClusterRole"), *of_kind(objects, "Role")]:
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {rule}"
                assert not any("*" in item for item in rule.get(key, [])), rule


def assert_bindings_are_consistent(objects: list[Manifest]) -> None:
    """Every binding binds the operator's ServiceAccount to a role the chart renders."""
    for binding in [*of_kind(objects, "ClusterRoleBinding"), *of_kind(objects, "RoleBinding")]:
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        named(objects, ref["kind"], ref["name"], namespace)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
        ]


def test_cluster_wide_rbac_grants_exactly_what_the_operator_needs(helm: Helm) -> None:
    objects = helm.template()
    assert_least_privilege(objects)
    assert_bindings_are_consistent(objects)
    assert grants(named(objects, "ClusterRole", FULLNAME)) == JOB_GRANTS
    cluster = named(objects, "ClusterRole", f"{FULLNAME}-cluster")
    assert grants(cluster) == CLUSTER_GRANTS | WEBHOOK_GRANTS | OWNER_GRANTS
    # The Roles: the certificates' Secrets, the operator's own pods, its Lease and the Events on
    # it, in the release namespace.
    assert identities(of_kind(objects, "Role")) == {
        ("Role", TLS_SECRET, NAMESPACE),
        ("Role", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("Role", SELF_ROLE, NAMESPACE),
    }
    assert identities(of_kind(objects, "RoleBinding")) == {
        ("RoleBinding", TLS_SECRET, NAMESPACE),
        ("RoleBinding", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("RoleBinding", SELF_ROLE, NAMESPACE),
    }
    self_role = named(objects, "Role", SELF_ROLE, NAMESPACE)
    assert grants(self_role) == SELF_GRANTS
    lease_rules = [r for r in self_role["rules"] if "leases" in r["resources"]]
    unrestricted = {v for r in lease_rules if "resourceNames" not in r for v in r["verbs"]}
    assert unrestricted == {"create"}, "a create cannot be limited by name"
    assert all(r["resourceNames"] == [LEASE] for r in lease_rules if "resourceNames" in r)
    route_rules = [r for r in self_role["rules"] if "endpointslices" in r["resources"]]
    unrestricted = {v for r in route_rules if "resourceNames" not in r for v in r["verbs"]}
    assert unrestricted == {"create"}, "a create cannot be limited by name"
    assert all(r["resourceNames"] == [FULLNAME] for r in route_rules if "resourceNames" in r)
    webhook_secret = named(objects, "Role", WEBHOOK_TLS_SECRET, NAMESPACE)
    assert webhook_secret["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [WEBHOOK_TLS_SECRET],
            "verbs": ["get", "patch"],
        }
    ]


def test_webhook_configuration_access_is_limited_to_its_own_name(helm: Helm) -> None:
    cluster = named(helm.template(), "ClusterRole", f"{FULLNAME}-cluster")
    webhook_rules = [r for r in cluster["rules"] if WEBHOOK[1] in r["resources"]]
    assert webhook_rules
    unrestricted = {v for r in webhook_rules if "resourceNames" not in r for v in r["verbs"]}
    assert unrestricted == {"create"}  # a create cannot be limited by name
    for rule in webhook_rules:
        if "resourceNames" in rule:
            assert rule["resourceNames"] == [f"{FULLNAME}.{NAMESPACE}.svc"]
    (owner_rule,) = [r for r in cluster["rules"] if "clusterroles" in r["resources"]]
    assert owner_rule["resourceNames"] == [f"{FULLNAME}-cluster"] == [cluster["metadata"]["name"]]


def test_watch_namespaces_render_roles_per_namespace(helm: Helm) -> None:
    objects = helm.template({"watchNamespaces": ["a", "b"]})
    assert_least_privilege(objects)
    assert_bindings_are_consistent(objects)
    assert container(objects)["args"] == [
        "--log-level",
        "info",
        "--namespace",
        "a",
        "--namespace",
        "b",
        *ELECTION_ARGS,
        *WEBHOOK_ARGS,
        *TLS_ARGS,
    ]
    for namespace in ("a", "b"):
        assert grants(named(objects, "Role", FULLNAME, namespace)) == JOB_GRANTS
        binding = named(objects, "RoleBinding", FULLNAME, namespace)
        assert binding["roleRef"]["kind"] == "Role"
    job_roles = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == FULLNAME]
    assert {o["metadata"]["namespace"] for o in job_roles} == {"a", "b"}
    # Only cluster-scoped resources stay in a ClusterRole.
    cluster_roles = of_kind(objects, "ClusterRole")
    assert [r["metadata"]["name"] for r in cluster_roles] == [f"{FULLNAME}-cluster"]
    assert all_grants(cluster_roles) == CLUSTER_GRANTS | WEBHOOK_GRANTS | OWNER_GRANTS
    bindings = of_kind(objects, "ClusterRoleBinding")
    assert [b["metadata"]["name"] for b in bindings] == [f"{FULLNAME}-cluster"]


def test_rbac_and_service_account_can_be_left_to_the_cluster_admin(helm: Helm) -> None:
    objects = helm.template(
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "operator"}}
    )
    assert identities(objects) == {
        ("Service", FULLNAME, NAMESPACE),
        ("Service", REPLICAS_SERVICE, NAMESPACE),
        ("Deployment", FULLNAME, NAMESPACE),
        ("PodDisruptionBudget", FULLNAME, NAMESPACE),
        ("Secret", TLS_SECRET, NAMESPACE),
        ("Secret", WEBHOOK_TLS_SECRET, NAMESPACE),
        ("NetworkPolicy", FULLNAME, NAMESPACE),
    }
    pod = named(objects, "Deployment", FULLNAME, NAMESPACE)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "operator"
    # No ClusterRole of the release to own the webhook configurations.
    assert "ELASTICJOB_WEBHOOK_OWNER" not in env_of(container(objects))


# --- rendezvous TLS ----------------------------------------------------------------------------

TLS_MOUNT = "/etc/elasticjob/rendezvous-tls"


def test_rendezvous_tls_defaults_to_a_certificate_the_operator_makes_and_keeps(
    helm: Helm,
) -> None:
    objects = helm.template()
    c = container(objects)
    assert env_of(c)["ELASTICJOB_RENDEZVOUS_URL"] == RENDEZVOUS_URL
    assert c["args"][-2:] == TLS_ARGS
    # The operator names the Service's DNS names from these (main.py --rendezvous-tls-secret).
    assert env_of(c)["ELASTICJOB_SERVICE_NAME"] == FULLNAME
    assert env_of(c)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    secret = named(objects, "Secret", TLS_SECRET, NAMESPACE)
    assert secret["type"] == "Opaque"
    assert "data" not in secret and "stringData" not in secret, "the operator fills it"
    role = named(objects, "Role", TLS_SECRET, NAMESPACE)
    assert grants(role) == TLS_GRANTS
    assert [r["resourceNames"] for r in role["rules"]] == [[TLS_SECRET]]
    binding = named(objects, "RoleBinding", TLS_SECRET, NAMESPACE)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": TLS_SECRET,
    }
    assert_bindings_are_consistent(objects)
    assert TLS_MOUNT not in {m["mountPath"] for m in c["volumeMounts"]}


def test_a_provided_certificate_is_mounted_and_nothing_is_made(helm: Helm) -> None:
    objects = helm.template({"rendezvous": {"tls": {"enabled": True, "secretName": "rdzv-cert"}}})
    c = container(objects)
    assert env_of(c)["ELASTICJOB_RENDEZVOUS_URL"] == RENDEZVOUS_URL
    assert c["args"][-2:] == ["--rendezvous-tls-dir", TLS_MOUNT]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[TLS_MOUNT]["readOnly"] is True
    pod = named(objects, "Deployment", FULLNAME, NAMESPACE)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[TLS_MOUNT]["name"]]["secret"] == {
        "secretName": "rdzv-cert",
        "defaultMode": 0o400,
    }
    assert identities(of_kind(objects, "Secret")) == {("Secret", WEBHOOK_TLS_SECRET, NAMESPACE)}
    assert identities(of_kind(objects, "Role")) == {
        ("Role", SELF_ROLE, NAMESPACE),
        ("Role", WEBHOOK_TLS_SECRET, NAMESPACE),
    }


def test_tls_disabled_serves_plain_http(helm: Helm) -> None:
    objects = helm.template({"rendezvous": {"tls": {"enabled": False, "secretName": "ignored"}}})
    c = container(objects)
    assert env_of(c)["ELASTICJOB_RENDEZVOUS_URL"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8470"
    assert not any(a.startswith("--rendezvous-tls") for a in c["args"])
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/var/tmp/elasticjob"]
    assert identities(of_kind(objects, "Secret")) == {("Secret", WEBHOOK_TLS_SECRET, NAMESPACE)}
    assert identities(of_kind(objects, "Role")) == {
        ("Role", SELF_ROLE, NAMESPACE),
        ("Role", WEBHOOK_TLS_SECRET, NAMESPACE),
    }


# --- NetworkPolicy -----------------------------------------------------------------------------

WORKERS = {"matchLabels": {LABEL_ROLE: ROLE_WORKER}}
SCRAPERS = [
    {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]
ANYONE = None


def ingress_by_port(objects: list[Manifest]) -> dict[str, list[Manifest] | None]:
    """Container port name -> the peers the NetworkPolicy lets reach it (None: anyone)."""
    policy = named(objects, "NetworkPolicy", FULLNAME, NAMESPACE)
    assert policy["spec"]["podSelector"] == {"matchLabels": SELECTOR}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = container_ports(container(objects))
    result: dict[str, list[Manifest] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            assert port["port"] in ports, f"no container port {port['port']}"
            assert port["port"] not in result, f"two rules for {port['port']}"
            result[port["port"]] = rule.get("from")
    return result


def test_network_policy_lets_workers_reach_rendezvous_and_scrapers_metrics(helm: Helm) -> None:
    assert ingress_by_port(helm.template()) == {
        "rendezvous": [{"podSelector": WORKERS, "namespaceSelector": {}}],
        "metrics": SCRAPERS,
        "health": ANYONE,  # the kubelet's probes
        "webhook": ANYONE,  # the API server
    }


def test_network_policy_admits_workers_of_the_watched_namespaces_only(helm: Helm) -> None:
    rules = ingress_by_port(helm.template({"watchNamespaces": ["a", "b"]}))
    assert rules["rendezvous"] == [
        {
            "podSelector": WORKERS,
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
                ]
            },
        }
    ]


@pytest.mark.parametrize(
    "metrics_from",
    [
        [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}],
        [{"ipBlock": {"cidr": "10.0.0.0/8"}}, {"podSelector": {"matchLabels": {"app": "x"}}}],
    ],
)
def test_network_policy_scrapers_are_configurable(helm: Helm, metrics_from: list[Manifest]) -> None:
    rules = ingress_by_port(helm.template({"networkPolicy": {"metricsFrom": metrics_from}}))
    assert rules["metrics"] == metrics_from


def test_network_policy_without_scrapers_closes_metrics(helm: Helm) -> None:
    rules = ingress_by_port(
        helm.template({"networkPolicy": {"metricsFrom": []}, "webhook": {"enabled": False}})
    )
    assert rules == {
        "rendezvous": [{"podSelector": WORKERS, "namespaceSelector": {}}],
        "health": ANYONE,
    }


def test_network_policy_can_be_left_out(helm: Helm) -> None:
    assert not of_kind(helm.template({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_chart_readme_says_that_network_policy_needs_an_enforcing_cni() -> None:
    readme = (CHART / "README.md").read_text()
    for text in ("networkPolicy.metricsFrom", "rendezvous.tls.secretName", "enforce"):
        assert text in readme, text


# --- the CRD copy and the values schema ------------------------------------------------------


def test_chart_crd_is_an_exact_copy_of_the_generated_crd() -> None:
    assert sorted(p.name for p in CHART_CRD.parent.iterdir()) == [CRD.name]
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), (
        f"{CHART_CRD.relative_to(REPO)} differs from {CRD.relative_to(REPO)}; refresh the "
        f"chart's copy from the repository root: "
        f"cp {CRD.relative_to(REPO)} {CHART_CRD.parent.relative_to(REPO)}/"
    )


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"logLevel": "loud"}, "/logLevel"),
        ({"replicas": "1"}, "/replicas"),
        ({"replicas": -1}, "/replicas"),
        (
            {"metrics": {"serviceMonitor": {"enabled": True, "interval": ",s", "labels": {}}}},
            "/metrics/serviceMonitor/interval",
        ),
        ({"leaderElection": {"leaseDurationSeconds": 1}}, "/leaderElection"),
        (
            {
                "leaderElection": {
                    "leaseDurationSeconds": 3,
                    "renewDeadlineSeconds": 0,
                    "retryPeriodSeconds": 1,
                }
            },
            "/leaderElection/renewDeadlineSeconds",
        ),
        ({"watchNamespaces": "a"}, "/watchNamespaces"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"webhook": {"enabled": "yes"}}, "/webhook/enabled"),
        ({"rendezvous": {"tls": {"enabled": "yes"}}}, "/rendezvous/tls/enabled"),
        ({"rendezvous": {"tls": {"secretName": "Bad_Name"}}}, "/rendezvous/tls/secretName"),
        ({"rendezvous": {"tls": {"secret": "s"}}}, "secret"),
        ({"networkPolicy": {"enabled": 1}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"metricsFrom": {"podSelector": {}}}}, "/networkPolicy/metricsFrom"),
        ({"networkPolicy": {"metricsFrom": [{}]}}, "/networkPolicy/metricsFrom/0"),
        ({"networkPolicy": {"metricsFrom": [{"pods": {}}]}}, "/networkPolicy/metricsFrom/0"),
        ({"watchNamespace": ["a"]}, "watchNamespace"),
    ],
)
def test_schema_rejects_bad_values(helm: Helm, values: dict[str, Any], path: str) -> None:
    result = helm.template_result(values)
    assert result.returncode != 0, f"helm template accepted {values}"
    assert "schema" in result.stderr
    assert path in result.stderr, result.stderr


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_schema_accepts_every_log_level(helm: Helm, level: str) -> None:
    assert container(helm.template({"logLevel": level}))["args"][:2] == ["--log-level", level]


def test_schema_describes_every_default_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert set(defaults) <= set(schema["properties"])


def test_notes_show_how_to_use_the_operator(helm: Helm) -> None:
    result = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    example = yaml.safe_load((REPO / EXAMPLE).read_text())
    for text in (
        f"kubectl apply -f {EXAMPLE}",
        "kubectl get ej",
        f"kubectl scale ej/{example['metadata']['name']} --replicas=5",
        RENDEZVOUS_URL,
        f"ValidatingWebhookConfiguration {FULLNAME}.{NAMESPACE}.svc",
        "`helm uninstall` removes the webhook configurations with the release",
    ):
        assert text in notes, text
    values = ["--set", "rbac.create=false", "--set", "serviceAccount.name=operator"]
    install = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    without_rbac = helm.run(*install, *values)
    assert without_rbac.returncode == 0, without_rbac.stderr
    notes = without_rbac.stdout.split("NOTES:", 1)[1]
    assert f"mutatingwebhookconfiguration {FULLNAME}.{NAMESPACE}.svc" in notes, notes


def test_the_readmes_rbac_table_is_what_the_chart_grants(helm: Helm) -> None:
    """The chart README's table of rules is made from the chart (``reference_docs``)."""

    def template(values: Mapping[str, Any]) -> list[Manifest]:
        return helm.template(values)

    assert NAMESPACE == RELEASE_NAMESPACE
    assert table_in(CHART / "README.md", "rbac") == rbac_table(template), (
        "the chart README's RBAC table is stale: run python -m tests.support.write_reference_docs"
    )


# ---- monitoring: a ServiceMonitor and the Grafana dashboard (off by default) ----------------

MONITORING: dict[str, Any] = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
        "grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"}},
    }
}


def test_monitoring_objects_are_off_by_default(helm: Helm) -> None:
    assert not {"ServiceMonitor", "ConfigMap"} & {o["kind"] for o in helm.template()}


def test_the_service_monitor_scrapes_the_operators_metrics_port(helm: Helm) -> None:
    objects = helm.template(MONITORING)
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    # It selects both Services by their labels; only the one in front of every replica has a
    # metrics port, so every replica is scraped (a standby's say so) and each once.
    (service,) = [
        o
        for o in of_kind(objects, "Service")
        if "metrics" in {p["name"] for p in o["spec"]["ports"]}
    ]
    assert service["metadata"]["name"] == REPLICAS_SERVICE
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == SELECTOR
    assert SELECTOR.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s"}
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


def served_metric_names() -> set[str]:
    """The names of the samples the operator serves for a running job."""
    return {name for metric in served_metrics() for name in metric.samples}


def test_the_dashboard_ships_in_a_configmap_and_queries_served_metrics_only(helm: Helm) -> None:
    objects = helm.template(MONITORING)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["name"] == f"{FULLNAME}-dashboard"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["elasticjob.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\belasticjob_[a-z_]+", e)}
    assert used, "the dashboard queries nothing"
    assert used <= served_metric_names(), used - served_metric_names()
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Goodput", "Time to recover", "World size over time"} <= titles
