"""The README's first command: the digits job as an ElasticJob on a real Kubernetes cluster on
this machine (devcluster), with the operator installed by helm.

It brings devcluster up on real nodes (kubelets on containerd, running the images built from
Dockerfile.operator and Dockerfile.worker; on a fresh machine it first builds Kubernetes and
the images: about 15 minutes, once), or with ``--runtime process`` on process nodes (pods as
host processes: quicker, no containers). It installs the operator's chart, applies
examples/elasticjob.yaml, then scales
the job from 3 to 5 workers with `kubectl scale`, SIGKILLs a worker, then the leading operator
replica (the standby takes over), and follows the job to its end, printing `kubectl get ej`,
the job's events and rank 0's log as they change.
The cluster is torn down at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # devcluster is a tool of the repository, not of the package

from devcluster.cluster import Cluster  # noqa: E402
from devcluster.config import ClusterConfig  # noqa: E402
from devcluster.imagebuild import ensure_images  # noqa: E402
from devcluster.stages import stage  # noqa: E402
from elasticjob.driver.job_record import EventKind, JobRecordData  # noqa: E402
from elasticjob.job_timeline import render  # noqa: E402

LOGS = REPO / ".logs"
"""Where the set-up's tools write (building the images, the cluster, helm)."""
NAMESPACE = "default"
OPERATOR_NS = "elasticjob-system"
ROUTE = "{.endpoints[*].targetRef.name}"
"""The operator pods the rendezvous Service routes workers to: the leader writes itself there."""


def say(message: str) -> None:
    print(f"\n>>> {message}", flush=True)


class Demo:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._shown: set[str] = set()

    def kubectl(self, *args: str) -> str:
        return self.cluster.kubectl("-n", NAMESPACE, *args, timeout=60).stdout

    def status(self) -> dict[str, Any]:
        job = json.loads(self.kubectl("get", "ej", "digits", "-o", "json"))
        result: dict[str, Any] = job.get("status") or {}
        return result

    def show_progress(self) -> None:
        """Print what is new: the job's row, its events, rank 0's epoch lines."""
        # `kubectl get ej` without its AGE column, so a row shows only when something changed.
        lines = [
            row.rsplit(maxsplit=1)[0] for row in self.kubectl("get", "ej", "digits").splitlines()
        ]
        events = json.loads(self.kubectl("get", "events", "-o", "json"))["items"]
        lines += [
            f"  event {e['type']:7} {e['reason']:16} {e['message']}"
            for e in sorted(events, key=lambda e: e.get("lastTimestamp") or "")
            if e["involvedObject"]["kind"] == "ElasticJob"
        ]
        for worker in self.status().get("workers", []):
            if 0 in worker["ranks"]:
                log = self.cluster.kubectl("-n", NAMESPACE, "logs", worker["pod"], check=False)
                lines += [
                    f"  rank 0: {line}" for line in log.stdout.splitlines() if "epoch" in line
                ]
        for line in lines:
            if line not in self._shown:
                self._shown.add(line)
                print(line, flush=True)

    def draw_timeline(self, out: Path, timeout: float = 60) -> Path:
        """Draw the job's record (ConfigMap digits-record, complete once the job's end is in
        it) as ``out`` and as the HTML page beside it."""
        deadline = time.monotonic() + timeout
        while True:
            found = json.loads(self.kubectl("get", "configmap", "digits-record", "-o", "json"))
            record = JobRecordData.model_validate_json(found["data"]["record.json"])
            if record.events and record.events[-1].kind is EventKind.FINISHED:
                break
            if time.monotonic() > deadline:
                break  # draw what there is
            time.sleep(1)
        render(record, out)
        render(record, out.with_suffix(".html"))
        return out

    def leader(self) -> str:
        """The operator pod that leads ("" while none does)."""
        found = self.cluster.kubectl(
            *("-n", OPERATOR_NS, "get", "endpointslice", "elasticjob-operator"),
            *("-o", f"jsonpath={ROUTE}"),
            timeout=60,
        )
        names = found.stdout.split()
        return names[0] if len(names) == 1 else ""

    def new_leader(self, old: str, timeout: float = 120) -> str:
        """Wait until an operator pod other than ``old`` leads; its name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader and leader != old:
                return leader
            time.sleep(0.2)
        raise SystemExit(f"timed out waiting for an operator to lead after {old}")

    def until(
        self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 300
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.show_progress()
            status = self.status()
            if check(status):
                return status
            time.sleep(1)
        raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--runtime",
        choices=("containerd", "process"),
        default="containerd",
        help="real nodes (default) or process nodes",
    )
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="elasticjob-demo-"))
    config = ClusterConfig.private(run_dir, 91, runtime=args.runtime)
    cluster = Cluster(config)
    if args.runtime == "containerd":
        building = "building the images from Dockerfile.operator and Dockerfile.worker"
        with stage(f"{building} (about 3.5 minutes the first time)", LOGS / "images.log"):
            ensure_images(config.cache_dir)
    with stage(f"starting devcluster in {run_dir} ({args.runtime} nodes)", LOGS / "cluster.log"):
        cluster.up(timeout=900)
    demo = Demo(cluster)
    try:
        installing = "helm install elasticjob-operator deploy/helm/elasticjob-operator --wait"
        with stage(installing, LOGS / "helm.log"):
            cluster.helm(
                "install",
                "elasticjob-operator",
                str(REPO / "deploy/helm/elasticjob-operator"),
                "-n",
                "elasticjob-system",
                "--create-namespace",
                "--wait",
                "--timeout",
                "180s",
                timeout=240,
            )
        say("kubectl apply -f examples/elasticjob.yaml  (3 workers, min 2, max 5)")
        demo.kubectl("apply", "-f", str(REPO / "examples/elasticjob.yaml"))
        demo.until("training", lambda s: s.get("phase") == "Running" and s.get("worldSize") == 3)
        say("kubectl scale ej/digits --replicas=5")
        demo.kubectl("scale", "ej/digits", "--replicas=5")
        scaled = demo.until("5 workers", lambda s: s.get("worldSize") == 5)
        victim = next(w for w in scaled["workers"] if 0 not in w["ranks"])
        say(f"SIGKILL the worker in pod {victim['pod']} on {victim['node']}")
        cluster.faults.kill(victim["pod"], NAMESPACE)
        demo.until(
            "recovery",
            lambda s: (
                s.get("resetCount", 0) > scaled.get("resetCount", 0) and s.get("phase") == "Running"
            ),
        )
        old = demo.leader() or demo.new_leader("")
        say(f"SIGKILL the leading operator in pod {old}: the standby operator takes over")
        killed = time.monotonic()
        cluster.faults.kill(old, OPERATOR_NS)
        new = demo.new_leader(old)
        say(f"operator pod {new} leads, {time.monotonic() - killed:.1f} s after the kill")
        final = demo.until(
            "the end of training", lambda s: s.get("phase") in ("Succeeded", "Failed"), 900
        )
        goodput = final.get("goodput") or {}
        say(
            f"job {final['phase']}: {final['round']} rounds, {final['resetCount']} resets, "
            f"goodput {goodput.get('ratio', 0):.1%}, last recovery "
            f"{goodput.get('lastRecoverySeconds')} s"
        )
        picture = demo.draw_timeline(run_dir / "digits-timeline.png")
        say(f"the job's timeline: {picture} (and {picture.with_suffix('.html')})")
        return 0 if final["phase"] == "Succeeded" else 1
    finally:
        if args.keep:
            say(f"cluster left running: export KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.down()


if __name__ == "__main__":
    sys.exit(main())
