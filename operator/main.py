"""``elasticjob-operator``: runs the ElasticJob operator (kopf) in this process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

import kopf

from elasticjob.operator import handlers
from elasticjob.operator.certs import ManagedCertificate, TLSMaterial, service_dns_names
from elasticjob.operator.leader_election import ElectionSettings
from elasticjob.operator.leader_lease import LeaseRef
from elasticjob.operator.operator_config import (
    LeaderElectionConfig,
    OperatorConfig,
    WebhookConfig,
)
from elasticjob.operator.operator_process import OperatorRuntime
from elasticjob.operator.service_route import ServiceRoute
from elasticjob.worker_contract import ENV_RENDEZVOUS_URL

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticjob-operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument(
        "--rendezvous-url",
        default=os.environ.get(ENV_RENDEZVOUS_URL),
        help="how worker pods reach this operator's rendezvous service",
    )
    parser.add_argument(
        "--bind-address",
        default=os.environ.get("POD_IP", "0.0.0.0"),
        help="address to serve on (default: $POD_IP, else all)",
    )
    parser.add_argument(
        "--webhook",
        action="store_true",
        help="serve the validating admission webhook (needs $ELASTICJOB_SERVICE_NAME"
        " and $POD_NAMESPACE; $ELASTICJOB_WEBHOOK_OWNER names the ClusterRole that owns its"
        " configuration)",
    )
    parser.add_argument(
        "--rendezvous-tls-dir",
        type=Path,
        help="serve an https rendezvous URL with the certificate in this directory (a mounted "
        "kubernetes.io/tls Secret: tls.crt, tls.key and the CA workers verify it with, ca.crt)",
    )
    parser.add_argument(
        "--rendezvous-tls-secret",
        help="serve an https rendezvous URL with a certificate the operator makes for its"
        " Service ($ELASTICJOB_SERVICE_NAME) and keeps in this Secret of $POD_NAMESPACE",
    )
    parser.add_argument(
        "--webhook-service",
        help="the Service the API server sends admission reviews to, every replica behind it "
        "(default: $ELASTICJOB_SERVICE_NAME, which also names the webhook configuration)",
    )
    parser.add_argument(
        "--webhook-tls-secret",
        help="keep the webhook's certificate in this Secret of $POD_NAMESPACE, so that every "
        "replica serves the same one (default: each start makes its own)",
    )
    parser.add_argument(
        "--leader-election-lease",
        help="lead (act on jobs, serve their rendezvous) only while holding this Lease of "
        "$POD_NAMESPACE; standby otherwise (default: lead alone, from the start)",
    )
    defaults = ElectionSettings()
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=defaults.lease_duration_s,
        help="seconds a standby waits for the leader's renewal before it takes the Lease",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=defaults.renew_deadline_s,
        help="seconds the leader acts on without a renewal before it stops",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=defaults.retry_period_s,
        help="seconds between two reads (and renewals) of the Lease",
    )
    parser.add_argument(
        "--no-worker-network-policy",
        dest="worker_network_policy",
        action="store_false",
        help="make no NetworkPolicy per job (by default, one admits only the job's own pods "
        "to its workers)",
    )
    parser.add_argument("--webhook-port", type=int, default=8443)
    parser.add_argument("--rendezvous-port", type=int, default=8470)
    parser.add_argument("--metrics-port", type=int, default=8471)
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=8472,
        help="serve kopf's liveness endpoint at /healthz on this port (0: not at all)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if not args.rendezvous_url:
        print(
            "elasticjob-operator: --rendezvous-url (or ELASTICJOB_RENDEZVOUS_URL) is required",
            file=sys.stderr,
        )
        return 2
    try:
        tls = rendezvous_tls(args, os.environ)
    except ValueError as exc:
        print(f"elasticjob-operator: {exc}", file=sys.stderr)
        return 2
    webhook = None
    if args.webhook:
        service = os.environ.get("ELASTICJOB_SERVICE_NAME")
        namespace = os.environ.get("POD_NAMESPACE")
        if not service or not namespace:
            print(
                "elasticjob-operator: --webhook needs ELASTICJOB_SERVICE_NAME and POD_NAMESPACE",
                file=sys.stderr,
            )
            return 2
        webhook = WebhookConfig(
            service=args.webhook_service or service,
            namespace=namespace,
            port=args.webhook_port,
            owner=os.environ.get("ELASTICJOB_WEBHOOK_OWNER") or None,
            configuration=f"{service}.{namespace}.svc",
            tls_secret=args.webhook_tls_secret,
        )
    try:
        election = leader_election(args, os.environ)
    except ValueError as exc:
        print(f"elasticjob-operator: {exc}", file=sys.stderr)
        return 2
    config = OperatorConfig(
        rendezvous_url=args.rendezvous_url,
        bind_address=args.bind_address,
        rendezvous_port=args.rendezvous_port,
        metrics_port=args.metrics_port,
        webhook=webhook,
        namespaces=tuple(args.namespace),
        rendezvous_tls=tls,
        own_pod=_own_pod(os.environ),
        service_route=service_route(os.environ, args.rendezvous_port),
        leader_election=election,
        worker_network_policy=args.worker_network_policy,
    )
    runtime = OperatorRuntime(config)
    memo = kopf.Memo(runtime=runtime)
    try:
        asyncio.run(
            kopf.operator(
                registry=handlers.REGISTRY,
                memo=memo,
                standalone=True,
                stop_flag=runtime.stop_flag,
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                liveness_endpoint=_liveness_endpoint(args.bind_address, args.liveness_port),
            )
        )
    except kopf.LoginError as exc:
        if not runtime.stop_flag.is_set():
            raise
        # On its way out kopf patches the webhook configuration once more (a no-op for our
        # persistent webhooks); after `helm uninstall` the operator's ServiceAccount is gone
        # and the API refuses it. The operator had stopped: that is a clean end.
        logger.warning(
            "stopped; the API no longer accepts the operator's credentials (%s), as after "
            "its ServiceAccount was deleted with the release",
            exc,
        )
    return 0


def rendezvous_tls(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> TLSMaterial | ManagedCertificate | None:
    """How the rendezvous service serves its URL: TLS for ``https`` (with the mounted or a
    managed certificate that covers the URL's host), plain HTTP for ``http``.

    Raises :class:`ValueError` with the reason when the options do not fit together."""
    url = urllib.parse.urlsplit(args.rendezvous_url)
    sources = [o for o in ("--rendezvous-tls-dir", "--rendezvous-tls-secret") if _given(args, o)]
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(
            f"--rendezvous-url must be http(s)://host:port, got {args.rendezvous_url!r}"
        )
    if url.scheme == "http":
        if sources:
            raise ValueError(f"{sources[0]} needs an https --rendezvous-url")
        return None
    if len(sources) != 1:
        raise ValueError(
            "an https --rendezvous-url needs one of --rendezvous-tls-dir and "
            "--rendezvous-tls-secret"
        )
    if args.rendezvous_tls_dir is not None:
        material = TLSMaterial.from_directory(args.rendezvous_tls_dir)
        if not material.valid_for(url.hostname):
            raise ValueError(
                f"the certificate in {args.rendezvous_tls_dir} is not valid for {url.hostname} "
                f"(it names {', '.join(material.dns_names()) or 'no DNS name'})"
            )
        return material
    service, namespace = environ.get("ELASTICJOB_SERVICE_NAME"), environ.get("POD_NAMESPACE")
    if not service or not namespace:
        raise ValueError("--rendezvous-tls-secret needs ELASTICJOB_SERVICE_NAME and POD_NAMESPACE")
    names = service_dns_names(service, namespace)
    return ManagedCertificate(
        secret=args.rendezvous_tls_secret,
        namespace=namespace,
        dns_names=tuple(names if url.hostname in names else [*names, url.hostname]),
    )


def leader_election(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> LeaderElectionConfig | None:
    """The election the operator takes part in (None: it leads alone). Raises
    :class:`ValueError` with the reason when the options do not fit together."""
    if not args.leader_election_lease:
        return None
    namespace = environ.get("POD_NAMESPACE")
    if not namespace:
        raise ValueError("--leader-election-lease needs POD_NAMESPACE")
    settings = ElectionSettings(args.lease_duration, args.renew_deadline, args.retry_period)
    return LeaderElectionConfig(LeaseRef(namespace, args.leader_election_lease), settings)


def _own_pod(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The operator's pod, from the downward API (None outside a pod)."""
    name, namespace = environ.get("POD_NAME"), environ.get("POD_NAMESPACE")
    return (namespace, name) if name and namespace else None


def service_route(environ: Mapping[str, str], port: int) -> ServiceRoute | None:
    """The rendezvous Service the operator's pod routes the workers with, from the downward
    API and the chart (None outside a pod, or when one of them is not given)."""
    pod, namespace = environ.get("POD_NAME"), environ.get("POD_NAMESPACE")
    uid, address = environ.get("POD_UID"), environ.get("POD_IP")
    service = environ.get("ELASTICJOB_SERVICE_NAME")
    if not (pod and namespace and uid and address and service):
        return None
    return ServiceRoute(namespace, service, pod, uid, address, port)


def _given(args: argparse.Namespace, option: str) -> bool:
    return getattr(args, option.lstrip("-").replace("-", "_")) is not None


def _liveness_endpoint(bind_address: str, port: int) -> str | None:
    """kopf's liveness endpoint: it answers while the operator's event loop and watch streams
    live, with the results of the ``@kopf.on.probe`` handlers."""
    if port == 0:
        return None
    host = f"[{bind_address}]" if ":" in bind_address else bind_address
    return f"http://{host}:{port}/healthz"


if __name__ == "__main__":
    sys.exit(main())
