"""Pod IPs and Service names."""

from __future__ import annotations

import pytest

from tests.support.kube import Kube, pod_manifest

pytestmark = pytest.mark.devcluster

POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]

SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('hello from ' + os.environ['HOSTNAME']).encode()\n"
    "        self.send_response(200)\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.HTTPServer((os.environ['POD_IP'], 8080), H).serve_forever()\n"
)

CLIENT = (
    "import sys, time, urllib.request\n"
    "deadline = time.time() + 20\n"
    "for url in sys.argv[1:]:\n"
    "    while True:\n"
    "        try:\n"
    "            print(url, urllib.request.urlopen(url, timeout=2).read().decode(), flush=True)\n"
    "            break\n"
    "        except OSError as err:\n"
    "            if time.time() > deadline:\n"
    "                print(url, 'failed:', err, flush=True)\n"
    "                sys.exit(1)\n"
    "            time.sleep(0.2)\n"
)


def _server(name: str, node: str) -> dict[str, object]:
    return pod_manifest(
        name,
        SERVER,
        env=POD_IP_ENV,
        restart="Always",
        nodeSelector={"kubernetes.io/hostname": node},
        labels={"app": name},
        readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    )


def _client(name: str, node: str, urls: list[str]) -> dict[str, object]:
    manifest = pod_manifest(name, CLIENT, nodeSelector={"kubernetes.io/hostname": node})
    manifest["spec"]["containers"][0]["command"] += urls  # type: ignore[index]
    return manifest


def test_pods_on_different_nodes_talk_over_pod_ips(kube: Kube) -> None:
    kube.apply(_server("server", "node-1"))
    server = kube.wait_ready("server")
    ip = server["status"]["podIP"]
    kube.apply(_client("client", "node-2", [f"http://{ip}:8080/"]))
    client = kube.wait_phase("client", "Succeeded", "Failed")
    assert client["spec"]["nodeName"] != server["spec"]["nodeName"]
    assert client["status"]["podIP"] != ip
    assert client["status"]["phase"] == "Succeeded", kube.dump()
    assert f"http://{ip}:8080/ hello from server" in kube.kubectl("logs", "client")


def test_a_pod_reaches_another_through_a_service_name(kube: Kube) -> None:
    kube.apply(
        _server("echo", "node-3"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo-svc"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 8080, "targetPort": 8080}]},
        },
    )
    kube.wait_ready("echo")
    kube.wait(
        "Endpoints of echo-svc with a ready address",
        lambda: any(
            s.get("addresses") for s in (kube.get("endpoints", "echo-svc") or {}).get("subsets", [])
        ),
    )
    urls = [
        "http://echo-svc:8080/",
        f"http://echo-svc.{kube.ns}.svc:8080/",
        f"http://echo-svc.{kube.ns}.svc.cluster.local:8080/",
    ]
    kube.apply(_client("caller", "node-4", urls))
    pod = kube.wait_phase("caller", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", kube.dump()
    logs = kube.kubectl("logs", "caller")
    for url in urls:
        assert f"{url} hello from echo" in logs
