"""Command line: ``python -m devcluster up|down|status|kubeconfig|logs|fault|build|images``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

from devcluster.bench import run_bench
from devcluster.build import find_binaries, run_prereqs
from devcluster.cluster import Cluster
from devcluster.config import RUNTIMES, ClusterConfig, default_cache_dir, default_run_dir
from devcluster.faults import FaultError
from devcluster.imagebuild import ensure_images
from devcluster.realbench import run_real_bench

logger = logging.getLogger(__name__)


def _attach(run_dir: Path) -> Cluster:
    if not (run_dir / "config.json").exists():
        raise SystemExit(f"no cluster in {run_dir}; start one with `python -m devcluster up`")
    return Cluster.from_run_dir(run_dir)


def cmd_up(args: argparse.Namespace) -> int:
    """Start a cluster."""
    extended = dict(item.split("=", 1) for item in args.node_resource)
    cfg = ClusterConfig(
        run_dir=args.run_dir,
        runtime=args.runtime,
        net=args.net,
        nodes=args.nodes,
        node_cpu=args.node_cpu,
        node_memory=args.node_memory,
        node_pods=args.node_pods,
        extended_resources=extended,
        apiserver_port=args.api_port,
        image_map=args.image_map,
    )
    cluster = Cluster(cfg)
    started = time.monotonic()
    try:
        cluster.up(timeout=args.timeout)
    except KeyboardInterrupt:
        return 130
    print(f"devcluster up in {time.monotonic() - started:.1f} s: {cfg.nodes} nodes")
    print(f"  export KUBECONFIG={cfg.kubeconfig}")
    print(f"  export PATH={cfg.bin_dir}:$PATH   # helm, kubectl")
    print("  python -m devcluster down   # stops everything")
    if not args.foreground:
        return 0
    print("running in the foreground; Ctrl-C stops the cluster")
    stop = {"now": False}

    def request_stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        while not stop["now"]:
            signal.pause()
    finally:
        cluster.down()
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop a cluster."""
    if not (args.run_dir / "config.json").exists():
        print(f"no cluster in {args.run_dir}")
        return 0
    Cluster.from_run_dir(args.run_dir).down()
    print("devcluster stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Show components, nodes and pods."""
    cluster = _attach(args.run_dir)
    running = cluster.running()
    for name, alive in running.items():
        print(f"{name:26} {'running' if alive else 'STOPPED'}")
    if not running or not all(running.values()):
        print("cluster is not (fully) running")
        return 1
    print(f"kubeconfig                 {cluster.kubeconfig}")
    if cluster.config.real:
        nodes = cluster.kubectl("get", "nodes", "-o", "wide", check=False)
        pods = cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False)
        print(nodes.stdout + pods.stdout, end="")
        return 0
    try:
        status = cluster.faults.agent_status()
    except (OSError, FaultError) as err:
        print(f"agent not answering: {err}")
        return 1
    for name, node in status["nodes"].items():
        state = "deleted" if node["deleted"] else "ok" if node["heartbeating"] else "no heartbeat"
        print(f"node {name:21} {node['ip']:15} {state}")
    print(f"pods running on the nodes: {len(status['pods'])}")
    return 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    """Print the admin kubeconfig path (or its content)."""
    cfg = ClusterConfig.load(args.run_dir) if (args.run_dir / "config.json").exists() else None
    if cfg is None or not cfg.kubeconfig.exists():
        print(f"no cluster in {args.run_dir}", file=sys.stderr)
        return 1
    print(cfg.kubeconfig.read_text() if args.content else cfg.kubeconfig)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a pod's logs: process nodes from disk (also after the pod is gone), real nodes
    through the API from the kubelet (``kubectl logs``)."""
    cluster = _attach(args.run_dir)
    if cluster.config.real:
        argv = [
            "logs",
            "-n",
            args.namespace,
            args.pod,
            *(["-c", args.container] * bool(args.container)),
        ]
        result = cluster.kubectl(*argv, check=False)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode
    cfg = cluster.config
    dirs = sorted(
        cfg.pods_dir.glob(f"{args.namespace}_{args.pod}_*/logs"), key=lambda p: p.stat().st_mtime
    )
    if not dirs:
        print(f"no logs for pod {args.namespace}/{args.pod}", file=sys.stderr)
        return 1
    containers = sorted(p.name for p in dirs[-1].iterdir())
    chosen = [args.container] if args.container else containers
    for name in chosen:
        runs = sorted((dirs[-1] / name).glob("*.log"), key=lambda p: int(p.stem))
        if not runs:
            continue
        if len(chosen) > 1:
            print(f"==> {name} <==")
        sys.stdout.write(runs[-1].read_text(errors="replace"))
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    """Inject a fault through the agent."""
    faults = _attach(args.run_dir).faults
    try:
        if args.fault in ("kill", "stop", "cont"):
            pids = getattr(faults, args.fault)(args.target, args.namespace, args.container)
            print(f"signalled pids {pids}")
        elif args.fault == "node-notready":
            faults.node_notready(args.target, args.seconds)
        elif args.fault == "node-ready":
            faults.node_ready(args.target)
        elif args.fault == "node-delete":
            faults.node_delete(args.target)
        elif args.fault == "node-add":
            faults.node_add(args.target)
        elif args.fault == "evict":
            faults.evict(args.target, args.namespace)
        elif args.fault == "partition":
            faults.partition(args.target, args.namespace, args.mode, args.allow)
        elif args.fault == "heal":
            faults.heal(args.target, args.namespace)
        elif args.fault == "slow":
            pids = faults.slow(args.target, args.namespace, args.cpus, args.container)
            print(f"throttled pids {pids} to {args.cpus} CPUs")
    except FaultError as err:
        print(f"fault failed: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    """Build/fetch the binaries now (normally done by the first `up`)."""
    run_prereqs(default_cache_dir())
    bins = find_binaries(default_cache_dir(), build=False)
    print(json.dumps({k: str(v) for k, v in vars(bins).items()}, indent=2))
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    """Build (or find cached) the pause, base, operator and worker images."""
    for image in ensure_images(default_cache_dir(), rebuild=args.rebuild):
        took = "cached" if image.build_seconds is None else f"built in {image.build_seconds:.1f} s"
        print(f"{image.name:48} {image.archive.stat().st_size / 2**20:7.0f} MiB  {took}")
        print(f"  {image.archive}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure up time, pod start latency and agent CPU on a private cluster."""
    if args.runtime == "containerd":
        result = run_real_bench(samples=args.samples)
    else:
        result = run_bench(samples=args.samples, idle=args.idle, window=args.window)
    print(json.dumps({k: round(v, 3) for k, v in result.items()}, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    p.add_argument("--run-dir", type=Path, default=default_run_dir(), help="runtime state")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster (builds the binaries on first use)")
    up.add_argument(
        "--runtime", choices=RUNTIMES, default="process",
        help="process: the node agent runs pods as host processes (fast); containerd: real "
        "kubelets, containerd, runc, CNI and kube-proxy, one network namespace per node",
    )  # fmt: skip
    up.add_argument("--nodes", type=int, default=0, help="default: 4 process or 3 real nodes")
    up.add_argument(
        "--net", type=int, default=0,
        help="0..219: address block of this cluster (beside others on this machine)",
    )  # fmt: skip
    up.add_argument("--node-cpu", default="4")
    up.add_argument("--node-memory", default="8Gi")
    up.add_argument("--node-pods", type=int, default=110)
    up.add_argument(
        "--node-resource", action="append", default=[], metavar="NAME=COUNT",
        help="extended resource per node, e.g. nvidia.com/gpu=2",
    )  # fmt: skip
    up.add_argument("--api-port", type=int, default=6443)
    up.add_argument(
        "--image-map", action="append", default=[], metavar="PATTERN=KIND",
        help="extra image rule; KIND is project, python or host",
    )  # fmt: skip
    up.add_argument("--timeout", type=float, default=120.0)
    up.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops")
    up.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop everything").set_defaults(fn=cmd_down)
    sub.add_parser("status", help="components, nodes, pods").set_defaults(fn=cmd_status)
    kc = sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    kc.add_argument("--content", action="store_true", help="print the file itself")
    kc.set_defaults(fn=cmd_kubeconfig)
    logs = sub.add_parser("logs", help="a pod's logs (process nodes: from disk)")
    logs.add_argument("pod")
    logs.add_argument("-n", "--namespace", default="default")
    logs.add_argument("-c", "--container")
    logs.set_defaults(fn=cmd_logs)
    fault = sub.add_parser("fault", help="inject a fault")
    fault.add_argument(
        "fault",
        choices=["kill", "stop", "cont", "evict", "node-notready", "node-ready", "node-delete",
                 "node-add", "partition", "heal", "slow"],
    )  # fmt: skip
    fault.add_argument("target", help="pod name, or node name for node-* faults")
    fault.add_argument("-n", "--namespace", default="default")
    fault.add_argument("-c", "--container")
    fault.add_argument("--seconds", type=float, help="node-notready: come back after this long")
    fault.add_argument(
        "--cpus", type=float, default=0.2, help="slow: the CPUs the pod's container gets"
    )
    fault.add_argument(
        "--mode", choices=["all", "peers"], default="all",
        help="partition: all (only loopback works) or peers (other pods are cut off)",
    )  # fmt: skip
    fault.add_argument(
        "--allow", action="append", default=[], metavar="IP",
        help="partition: an address that stays reachable (e.g. the rendezvous'); repeatable",
    )  # fmt: skip
    fault.set_defaults(fn=cmd_fault)
    sub.add_parser("build", help="build/fetch the binaries").set_defaults(fn=cmd_build)
    images = sub.add_parser("images", help="build the node images (pause, base, operator, worker)")
    images.add_argument("--rebuild", action="store_true", help="build even when cached")
    images.set_defaults(fn=cmd_images)
    bench = sub.add_parser("bench", help="measure the numbers of docs/devcluster.md")
    bench.add_argument("--runtime", choices=RUNTIMES, default="process")
    bench.add_argument("--samples", type=int, default=20)
    bench.add_argument("--idle", type=int, default=50)
    bench.add_argument("--window", type=float, default=30.0)
    bench.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    result: int = args.fn(args)
    return result
