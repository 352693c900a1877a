"""What the real-node tests run: pods of the Debian base image, a small HTTP server."""

from __future__ import annotations

import json
from typing import Any

from devcluster.imagebuild import BASE_IMAGE
from tests.support.kube import Kube, Obj, pod_manifest

SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('hello from ' + os.environ['HOSTNAME']).encode()\n"
    "        self.send_response(200)\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "print('serving', flush=True)\n"
    "http.server.ThreadingHTTPServer(('', 8080), H).serve_forever()\n"
)

#: ``python3 -c FETCH url...``: one line per url, "url OK body" or "url FAIL error".
FETCH = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        body = urllib.request.urlopen(url, timeout=3).read().decode()\n"
    "        print(url, 'OK', body, flush=True)\n"
    "    except Exception as err:\n"
    "        print(url, 'FAIL', err, flush=True)\n"
)

SLEEPER = "import time; print('up', flush=True); time.sleep(3600)"


def real_pod(
    name: str, script: str, *, node: str | None = None, restart: str = "Never", **spec: Any
) -> Obj:
    """A pod running ``python3 -c script`` in the Debian base image, optionally on ``node``."""
    manifest = pod_manifest(name, script, image=BASE_IMAGE, restart=restart, **spec)
    manifest["spec"]["containers"][0]["command"][0] = "python3"
    if node:
        manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return manifest


def server(kube: Kube, name: str, node: str) -> Obj:
    """Start an HTTP server pod (port 8080) on ``node``; return it once Ready."""
    kube.apply(
        real_pod(
            name,
            SERVER,
            node=node,
            restart="Always",
            labels={"app": name},
            readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        )
    )
    return kube.wait_ready(name, timeout=120)


def service(name: str, app: str, *, port: int = 80, headless: bool = False) -> Obj:
    """A Service selecting ``app=<app>``, port ``port`` -> 8080."""
    spec: Obj = {"selector": {"app": app}, "ports": [{"port": port, "targetPort": 8080}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def fetch(kube: Kube, pod: str, *urls: str) -> dict[str, str]:
    """Run :data:`FETCH` in ``pod`` with ``kubectl exec``; url -> "OK body" / "FAIL ..."."""
    out = kube.kubectl("exec", pod, "--", "python3", "-c", FETCH, *urls)
    result = {}
    for line in out.splitlines():
        url, _, rest = line.partition(" ")
        result[url] = rest
    return result


def node_objects(kube: Kube) -> list[Obj]:
    """Every Node object."""
    items: list[Obj] = json.loads(kube.cluster.kubectl("get", "nodes", "-o", "json").stdout)[
        "items"
    ]
    return items


def condition(obj: Obj, kind: str) -> str | None:
    """Status of condition ``kind`` of a pod or node."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            return str(cond["status"])
    return None
