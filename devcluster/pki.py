"""Certificates, keys and tokens of a cluster, made with the ``openssl`` CLI.

Layout of ``<run_dir>/pki``:

- ``ca.crt``/``ca.key``: the cluster CA (also the pods' ``ca.crt``);
- ``apiserver.crt``/``.key``: serving certificate of kube-apiserver;
- ``kubelet.crt``/``.key``: serving certificate of the kubelets (the node agent's endpoints
  or the real kubelets), every node's address in its SANs;
- ``apiserver-kubelet-client.crt``/``.key``: what the apiserver presents to them;
- ``sa.key``/``sa.pub``: service-account token signing key;
- ``tokens.csv``: static bearer tokens of the admin and the components (real nodes: also of
  each kubelet, ``system:node:<name>`` in group ``system:nodes``, and of kube-proxy).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import subprocess
from pathlib import Path

from devcluster.config import ClusterConfig

logger = logging.getLogger(__name__)

#: Users of the static token file; all are cluster admins (group system:masters).
TOKEN_USERS = ("admin", "kube-controller-manager", "kube-scheduler", "devcluster-agent")
#: Real nodes: kube-proxy's user, bound to system:node-proxier by Kubernetes' default RBAC.
KUBE_PROXY_USER = "system:kube-proxy"


def node_user(node: str) -> str:
    """A real kubelet's user: the Node authorizer knows it by this name and group."""
    return f"system:node:{node}"


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def _signed_cert(pki: Path, name: str, subject: str, *, sans: list[str] | None, usage: str) -> None:
    """Create ``name.key`` and ``name.crt`` signed by the cluster CA."""
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    ext = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.csr").unlink()
    (pki / f"{name}.ext").unlink()


def ensure_pki(cfg: ClusterConfig) -> None:
    """Create every certificate, key and token that is missing (kept across runs)."""
    pki = cfg.pki_dir
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    marker = pki / f".complete-{cfg.runtime}-net{cfg.net}-nodes{cfg.nodes}"
    if marker.exists():
        return
    logger.info("creating certificates in %s", pki)
    for old in pki.iterdir():
        old.unlink()
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", "ca.key", "-subj", "/CN=devcluster-ca",
        "-days", "3650", "-sha256", "-out", "ca.crt", cwd=pki,
    )  # fmt: skip
    first_service_ip = str(next(ipaddress.ip_network(cfg.service_cidr).hosts()))
    api_sans = [
        "IP:127.0.0.1",
        f"IP:{cfg.api_host}",
        f"IP:{first_service_ip}",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    _signed_cert(pki, "apiserver", "/CN=kube-apiserver", sans=api_sans, usage="serverAuth")
    node_sans = [f"IP:{cfg.node_ip(i)}" for i in range(1, cfg.nodes + 1)]
    node_sans += [f"DNS:{n}" for n in cfg.node_names()]
    _signed_cert(pki, "kubelet", "/CN=devcluster-kubelet", sans=node_sans, usage="serverAuth")
    _signed_cert(
        pki,
        "apiserver-kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        sans=None,
        usage="clientAuth",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    lines = [f"{secrets.token_hex(24)},{user},{user},system:masters" for user in TOKEN_USERS]
    if cfg.real:
        lines.append(f"{secrets.token_hex(24)},{KUBE_PROXY_USER},{KUBE_PROXY_USER}")
        lines += [
            f"{secrets.token_hex(24)},{node_user(n)},{node_user(n)},system:nodes"
            for n in cfg.node_names()
        ]
    (pki / "tokens.csv").write_text("\n".join(lines) + "\n")
    for path in pki.iterdir():
        path.chmod(0o600)
    marker.touch()


def write_kubeconfig(cfg: ClusterConfig, path: Path, user: str, token: str) -> None:
    """Write a kubeconfig for ``user`` that trusts the cluster CA."""
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: devcluster
  cluster:
    server: {cfg.server}
    certificate-authority: {cfg.pki_dir / "ca.crt"}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: devcluster
  context:
    cluster: devcluster
    user: {user}
    namespace: default
current-context: devcluster
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
