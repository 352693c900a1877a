"""ElasticJobs as the end-to-end tests make them (the integration tests' training script in
worker pods) and watch them: status, conditions, worker logs and environment, the end of
what a test leaves running."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from elasticjob.operator.kube import secret_value
from elasticjob.operator.pods import READER_KEY, token_secret_name
from tests.support.job_runs import WORKER, JobRun, kill_leftovers, read_events
from tests.support.kube import Kube

STEP_TIME_S = 0.2
"""The pause of each training step in the e2e jobs' workers. The workers train while a test
waits for what it checks (a kill, a scale, a status); at 0.05 s a step each took a tenth of a
core, a third of the machine's CPU for a job of three pods, at 0.2 s a quarter of that. Tests
that measure the pace set their own."""


def job_manifest(
    name: str,
    log_dir: Path,
    stop_file: Path,
    command: list[str] | None = None,
    *,
    step_time_s: float = STEP_TIME_S,
    **spec: Any,
) -> dict[str, Any]:
    """An ElasticJob running the integration tests' worker script (the operator spreads its
    pods over nodes where there are enough), or ``command`` (one of those scripts too). The
    scripts and the directory of the event log and stop file are hostPath volumes at the
    same paths, so the test reads what workers write on real nodes (containers) and process
    nodes alike."""
    scratch = Path(os.path.commonpath([log_dir, stop_file.parent]))
    scratch.mkdir(parents=True, exist_ok=True)
    scratch.chmod(0o777)  # the worker image runs as a non-root user
    command = command or [
        "python",
        str(WORKER),
        "--log-dir",
        str(log_dir),
        "--stop-file",
        str(stop_file),
        "--epochs",
        "1000",
        "--samples",
        "96",
        "--step-time",
        str(step_time_s),
    ]
    mounts = {"tests": WORKER.parent, "scratch": scratch}
    return elastic_job(
        name,
        {
            "replicas": 3,
            "minReplicas": 2,
            "maxReplicas": 5,
            "backend": "gloo",
            "blacklist": {"cooldownSeconds": {"min": 300, "max": 600}},
            # Twice the default: under the suites' load on a 2-core machine a starting worker
            # once sent no heartbeat for 5.4 s. Tests of silent workers set their own.
            "heartbeatTimeoutSeconds": 10,
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "worker",
                            "image": "elasticjob/worker:0.1.0",
                            "command": command,
                            "volumeMounts": [
                                {"name": n, "mountPath": str(path)} for n, path in mounts.items()
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": n, "hostPath": {"path": str(path), "type": "Directory"}}
                        for n, path in mounts.items()
                    ],
                }
            },
            **spec,
        },
    )


def hsdp_job(
    name: str,
    command: list[str],
    *,
    grace_s: int,
    volumes: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An ElasticJob of two pods of two slots on Gloo, for HSDP (each pod's processes shard
    the state, the pods replicate it), running ``command`` in the worker image with
    ``volumes``; ``spec`` adds fields or replaces these."""
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace_s,
        "containers": [{"name": "worker", "image": "elasticjob/worker:0.1.0", "command": command}],
    }
    if volumes:
        pod["volumes"] = volumes
    return elastic_job(
        name,
        {
            "replicas": 2,
            "minReplicas": 1,
            "slotsPerWorker": 2,
            "backend": "gloo",
            "template": {"spec": pod},
            **spec,
        },
    )


def elastic_job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The ElasticJob ``name`` of ``spec``."""
    return {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": spec,
    }


START_SERVER_READY = "the start server is ready (torch imported)"
"""What a pod of several slots logs once a slot restarted in place forks from its start
server (``worker_runtime/agents/slot_processes.py``)."""

KILL_ONE_SLOT = (
    "import os, signal, time\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        environ = open(f'/proc/{pid}/environ', 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if b'ELASTICJOB_LOCAL_RANK=1\\0' in environ and pid != str(os.getpid()):\n"
    "        killed_at = time.time()\n"
    "        os.kill(int(pid), signal.SIGKILL)\n"
    "        print(pid, killed_at)\n"
    "        break\n"
)
"""SIGKILLs the training process of a pod's second slot (``python -c`` in the pod); prints
its PID and the time of the kill (the nodes share the host's clock)."""


def status(kube: Kube, name: str) -> dict[str, Any]:
    job = kube.get("ej", name) or {}
    result: dict[str, Any] = job.get("status") or {}
    return result


STARTUP_S = 300.0
"""How long a test waits for a job's first round: container creation on real nodes of a
loaded 2-core machine has taken over 100 s (the figure is no goal of the project's)."""


def wait_status(
    kube: Kube, name: str, what: str, check: Any, timeout: float = 120
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        current = status(kube, name)
        if check(current):
            return current
        ended_otherwise(name, what, current)
        return None

    found: dict[str, Any] = kube.wait(f"ElasticJob {name}: {what}", probe, timeout)
    return found


def ended_otherwise(name: str, what: str, current: dict[str, Any]) -> None:
    """Fail at once when the job failed while a test waits for something else of it: a
    failed job stays failed, and its status says why."""
    if current.get("phase") == "Failed":
        raise AssertionError(f"ElasticJob {name} failed while waiting for {what}: {current}")


_SEEN_LOGS: dict[tuple[str, str], str] = {}
"""The longest log read so far of every worker pod, by (namespace, pod): a deleted pod's log
goes with it on a real node, so what was read before still counts."""


def worker_logs(kube: Kube) -> str:
    """The logs of every worker pod of the test's namespace read so far, from the kubelet
    through the API (each current pod's log is read now)."""
    for pod in kube.pods("elasticjob.dev/job-name"):
        name = pod["metadata"]["name"]
        text = kube.logs(pod)
        if len(text) >= len(_SEEN_LOGS.get((kube.ns, name), "")):
            _SEEN_LOGS[(kube.ns, name)] = text
    return "\n".join(text for (ns, _), text in _SEEN_LOGS.items() if ns == kube.ns)


def stop_workers(kube: Kube, log_dir: Path) -> None:
    """End whatever workers a test left behind, at once: their pods on real nodes, their
    processes on process nodes (the events name their pids there). Called while a test
    fails (in a ``finally``), it reads the pods' logs first, for the test's report."""
    if sys.exc_info()[0] is not None:
        worker_logs(kube)
    if kube.cluster.config.runtime == "process":
        kill_leftovers(JobRun(0, "", "", read_events(log_dir)))
        return
    kube.delete_jobs_and_pods()


def job_secret_value(kube: Kube, job: str, key: str) -> str:
    """The value under ``key`` in the Secret of ``job`` (its reader token under
    ``READER_KEY``, each pod's own credential under the pod's name)."""
    secret = kube.get("secret", token_secret_name(job))
    value = None if secret is None else secret_value(secret, key)
    assert value is not None, f"the Secret of {job} holds no {key!r}"
    return value


def reader_token(kube: Kube, job: str) -> str:
    """The reader token of ``job``: reads its round, plan and notices."""
    return job_secret_value(kube, job, READER_KEY)


def worker_env(kube: Kube, job: str) -> dict[str, Any]:
    """The environment the operator gave a worker pod of ``job`` (plain values only)."""
    pod = kube.pods(f"elasticjob.dev/job-name={job}")[0]
    (worker,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in worker["env"] if "value" in e}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def wait_ready(kube: Kube, job: str, timeout_s: int = 180) -> None:
    """``kubectl wait --for=condition=Ready`` on the job."""
    kube.cluster.kubectl(
        *("-n", kube.ns, "wait", "--for=condition=Ready", f"ej/{job}", f"--timeout={timeout_s}s"),
        timeout=timeout_s + 30,
    )


def sleeper(name: str, **spec: Any) -> dict[str, Any]:
    """An ElasticJob whose workers only sleep: admission needs no training."""
    container: dict[str, Any] = {"name": "worker", "image": "busybox", "command": ["sleep", "600"]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "minReplicas": 2,
            "maxReplicas": 3,
            "template": {"spec": {"containers": [container]}},
            **spec,
        },
    }


def checkpointed_job(kube: Kube, name: str, log_dir: Path, stop_file: Path) -> None:
    """A claim, and a job of 2 pods that checkpoints to it every 2 commits."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-checkpoints"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    job = job_manifest(name, log_dir, stop_file, replicas=2, minReplicas=2)
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["volumes"].append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}
    )
    job["spec"]["checkpoint"] = {
        "volume": "checkpoints",
        "path": "/checkpoints",
        "everyCommits": 2,
        "keep": 2,
    }
    kube.apply(claim, job)


def training_with_a_checkpoint(kube: Kube, name: str) -> dict[str, Any]:
    return wait_status(
        kube,
        name,
        "training with a checkpoint written",
        lambda s: s.get("phase") == "Running" and s.get("lastCheckpoint") and s.get("progress"),
        timeout=240,
    )


def finish_trained_exactly_once(kube: Kube, name: str, log_dir: Path, stop_file: Path) -> None:
    stop_file.touch()
    done = wait_status(kube, name, "success", lambda s: s.get("phase") == "Succeeded", 240)
    assert done["restored"], done
    finals = [e for e in read_events(log_dir) if e["ev"] == "done"]
    assert finals, "no worker reported its final state"
    assert len({e["digest"] for e in finals}) == 1, f"ranks disagree: {finals}"
    (epochs,) = {e["epochs"] for e in finals}
    for e in finals:  # relative to the checkpoint: nothing skipped, nothing twice
        assert e["seen_min"] == e["seen_max"] == epochs, e
    reasons = {
        ev["reason"] for ev in json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    }
    assert "RestoredFromCheckpoint" in reasons, reasons


def epoch_ended(log_dir: Path) -> int:
    """The last epoch any worker logged the end of (-1: none yet)."""
    return max((e["epoch"] for e in read_events(log_dir) if e["ev"] == "epoch_end"), default=-1)


def worker_pods(kube: Kube, job: str) -> dict[str, int]:
    """The job's worker pods and their containers' restart counts."""
    return {
        p["metadata"]["name"]: sum(
            c.get("restartCount", 0) for c in p.get("status", {}).get("containerStatuses") or []
        )
        for p in kube.pods(f"elasticjob.dev/job-name={job}")
    }
