"""Pods run as processes: phases, exit codes, env, logs, deletion, images, probes."""

from __future__ import annotations

import base64

import pytest

from tests.support.kube import Kube, container_state, is_ready, pod_manifest

pytestmark = pytest.mark.devcluster


def test_python_pod_succeeds_with_exit_code_0(kube: Kube) -> None:
    kube.apply(pod_manifest("ok", "print('hello from a pod')"))
    pod = kube.wait_phase("ok", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    term = container_state(pod)["terminated"]
    assert term["exitCode"] == 0
    assert term["reason"] == "Completed"
    assert pod["status"]["podIP"].startswith("127.")
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "False",
        "Ready": "False",
    }


def test_failing_pod_fails_with_its_exit_code(kube: Kube) -> None:
    kube.apply(pod_manifest("bad", "import sys; sys.exit(7)"))
    pod = kube.wait_phase("bad", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Failed"
    term = container_state(pod)["terminated"]
    assert term["exitCode"] == 7
    assert term["reason"] == "Error"


def test_env_from_field_ref_and_secret_key_ref(kube: Kube) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"password": base64.b64encode(b"s3cret").decode()},
        },
        pod_manifest(
            "envpod",
            "import os\nfor k in ('MY_NAME','MY_NS','MY_NODE','MY_IP','PASSWORD','GREETING'):"
            " print(f'{k}={os.environ[k]}')",
            env=[
                {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {
                    "name": "PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}},
                },
                {"name": "GREETING", "value": "hi $(MY_NAME)"},
            ],
        ),
    )
    pod = kube.wait_phase("envpod", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", kube.dump()
    lines = set(kube.kubectl("logs", "envpod").splitlines())
    assert {
        "MY_NAME=envpod",
        f"MY_NS={kube.ns}",
        f"MY_NODE={pod['spec']['nodeName']}",
        f"MY_IP={pod['status']['podIP']}",
        "PASSWORD=s3cret",
        "GREETING=hi envpod",
    } <= lines


def test_kubectl_logs_returns_the_output(kube: Kube) -> None:
    kube.apply(pod_manifest("talker", "import sys\nfor i in range(3): print('line', i)"))
    kube.wait_phase("talker", "Succeeded")
    assert kube.kubectl("logs", "talker") == "line 0\nline 1\nline 2\n"
    assert kube.kubectl("logs", "talker", "--tail=1") == "line 2\n"


def test_delete_sends_sigterm_first_and_the_pod_disappears(kube: Kube) -> None:
    script = (
        "import signal, sys, time\n"
        "def bye(signum, frame):\n"
        "    print('got', signal.Signals(signum).name, flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n"
    )
    kube.apply(pod_manifest("victim", script, terminationGracePeriodSeconds=60))
    kube.wait_phase("victim", "Running")
    kube.wait("the handler to be installed", lambda: "waiting" in kube.disk_log("victim"))
    kube.kubectl("delete", "pod", "victim", "--wait=false")
    # Well inside the 60 s grace period: the pod went away because it handled SIGTERM.
    kube.wait_gone("pod", "victim", timeout=30)
    assert "got SIGTERM" in kube.disk_log("victim")


def test_unknown_image_reports_err_image_pull(kube: Kube) -> None:
    manifest = pod_manifest("noimage", "print(1)", image="registry.example.com/nope/nothing:1.0")
    kube.apply(manifest)
    pod = kube.wait_pod(
        "noimage",
        lambda p: (
            container_state(p).get("waiting", {}).get("reason")
            in ("ErrImagePull", "ImagePullBackOff")
        ),
        "waiting for an image pull error",
    )
    assert pod["status"]["phase"] == "Pending"
    assert "registry.example.com/nope/nothing:1.0" in container_state(pod)["waiting"]["message"]


def test_restart_policy_on_failure_restarts_until_success(kube: Kube) -> None:
    script = (
        "import os, sys\n"
        "flag = '/scratch/ran'\n"
        "if not os.path.exists(flag):\n"
        "    open(flag, 'w').close()\n"
        "    sys.exit(3)\n"
        "print('second run')\n"
    )
    kube.apply(
        pod_manifest(
            "retry",
            script,
            restart="OnFailure",
            volumes=[{"name": "scratch", "emptyDir": {}}],
            volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
        )
    )
    pod = kube.wait_phase("retry", "Succeeded", "Failed")
    status = pod["status"]["containerStatuses"][0]
    assert pod["status"]["phase"] == "Succeeded"
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3


def test_readiness_probes_exec_and_http(kube: Kube) -> None:
    server = (
        "import http.server, os\n"
        "handler = http.server.SimpleHTTPRequestHandler\n"
        "srv = http.server.HTTPServer((os.environ['POD_IP'], 8080), handler)\n"
        "srv.serve_forever()\n"
    )
    pod_ip = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    kube.apply(
        pod_manifest(
            "probed",
            server,
            env=pod_ip,
            restart="Always",
            readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
        ),
        pod_manifest(
            "execprobed",
            "import time; time.sleep(600)",
            restart="Always",
            readinessProbe={"exec": {"command": ["true"]}, "periodSeconds": 1},
        ),
    )
    assert is_ready(kube.wait_ready("probed"))
    assert is_ready(kube.wait_ready("execprobed"))


def test_init_container_and_volumes(kube: Kube) -> None:
    script = (
        "from pathlib import Path\n"
        "print(Path('/cfg/greeting').read_text())\n"
        "print(Path('/info/name').read_text())\n"
        "print(Path('/scratch/from-init').read_text())\n"
        "print(sorted(p.name for p in Path('/var/run/secrets/kubernetes.io/serviceaccount')"
        ".iterdir() if not p.name.startswith('.')))\n"
    )
    manifest = pod_manifest(
        "vols",
        script,
        volumes=[
            {"name": "cfg", "configMap": {"name": "settings"}},
            {
                "name": "info",
                "downwardAPI": {
                    "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                },
            },
            {"name": "work", "emptyDir": {}},
        ],
        volumeMounts=[
            {"name": "cfg", "mountPath": "/cfg", "readOnly": True},
            {"name": "info", "mountPath": "/info"},
            {"name": "work", "mountPath": "/scratch"},
        ],
    )
    manifest["spec"]["initContainers"] = [
        {
            "name": "prepare",
            "image": "busybox",
            "command": ["sh", "-c", "echo prepared > /scratch/from-init"],
            "volumeMounts": [{"name": "work", "mountPath": "/scratch"}],
        }
    ]
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"greeting": "hello from a configmap"},
        },
        manifest,
    )
    pod = kube.wait_phase("vols", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", kube.dump()
    init = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert init["exitCode"] == 0
    assert kube.kubectl("logs", "vols").splitlines() == [
        "hello from a configmap",
        "vols",
        "prepared",
        "",
        "['ca.crt', 'namespace', 'token']",
    ]


def test_extended_resources_are_scheduled(kube: Kube) -> None:
    def gpu_pod(name: str, gpus: int) -> dict[str, object]:
        manifest = pod_manifest(name, "import time; time.sleep(600)")
        manifest["spec"]["containers"][0]["resources"] = {  # type: ignore[index]
            "limits": {"nvidia.com/gpu": str(gpus)}
        }
        return manifest

    kube.apply(gpu_pod("two-gpus", 2), gpu_pod("too-many", 3))
    kube.wait_phase("two-gpus", "Running")
    pod = kube.wait_pod(
        "too-many",
        lambda p: any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in p["status"].get("conditions", [])
        ),
        "reported Unschedulable",
    )
    assert "nvidia.com/gpu" in str(pod["status"]["conditions"])
