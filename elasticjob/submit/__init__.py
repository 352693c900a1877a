"""Submit a local training script to a cluster as an ElasticJob, and follow it: the Python API
of ``elasticjob submit``, ``status``, ``logs`` and ``delete``.

>>> from elasticjob.submit import submit
>>> job = submit("train.py", workers="2:4", args=["--epochs", "5"])  # doctest: +SKIP
>>> job.follow()  # rank 0's log and the job's rounds; 0 once it Succeeded  # doctest: +SKIP

The code (a script, or a small folder) travels in a ConfigMap owned by the job; the worker
image runs it. See ``docs/your-first-job.md`` for an image of one's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticjob.driver.driver_types import JobMode
from elasticjob.submit.code_bundle import BundleError, bundle_code
from elasticjob.submit.follow import follow
from elasticjob.submit.job_client import JobClient, JobNotFoundError
from elasticjob.submit.job_request import (
    DEFAULT_IMAGE,
    JobRequest,
    RequestError,
    WorkerRange,
    check,
    code_config_map,
    default_name,
    job_manifest,
)


@dataclass(frozen=True)
class SubmittedJob:
    """A job on the cluster, by name."""

    client: JobClient
    name: str

    def status(self) -> dict[str, Any]:
        """The job's status as the operator last wrote it."""
        status: dict[str, Any] = self.client.read(self.name).get("status") or {}
        return status

    def follow(self, out: Callable[[str], None] = print, rank: int = 0) -> int:
        """Print rank ``rank``'s log and the job's story until it ends; 0 if it Succeeded."""
        return follow(self.client, self.name, out, rank)

    def delete(self) -> None:
        """Delete the job (its pods and code go with it)."""
        self.client.delete(self.name)


def build(
    path: str | Path,
    *,
    entry: str | None = None,
    name: str | None = None,
    workers: str = "1",
    args: Sequence[str] = (),
    image: str = DEFAULT_IMAGE,
    mode: JobMode | str = JobMode.ELASTIC,
    gpus: int = 0,
    env: Mapping[str, str] | None = None,
    cpu: str | None = None,
    memory: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ElasticJob and the ConfigMap of its code that :func:`submit` would create, checked
    against the operator's admission rules. Raises :class:`BundleError` or
    :class:`RequestError`, naming what to change."""
    if gpus < 0:
        raise RequestError(f"--gpus must be >= 0, got {gpus}")
    bundle = bundle_code(Path(path), entry)
    try:
        job_mode = JobMode(mode)
    except ValueError:
        raise RequestError(f"--mode: elastic or restart, got {mode!r}") from None
    request = JobRequest(
        name=name or default_name(bundle.entry),
        workers=WorkerRange.parse(workers),
        args=tuple(args),
        image=image,
        mode=job_mode,
        gpus=gpus,
        env=dict(env or {}),
        cpu=cpu,
        memory=memory,
    )
    job = job_manifest(request, bundle)
    check(job)
    return job, code_config_map(request, bundle)


def submit(
    path: str | Path,
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    **options: Any,
) -> SubmittedJob:
    """Create the job :func:`build` makes of ``path`` (a script or a folder) with
    ``options``, in ``namespace`` (default: the kubeconfig context's)."""
    job, config_map = build(path, **options)
    client = JobClient.connect(kubeconfig, context, namespace)
    created = client.create(job, config_map)
    return SubmittedJob(client, str(created["metadata"]["name"]))


__all__ = [
    "BundleError",
    "JobClient",
    "JobNotFoundError",
    "RequestError",
    "SubmittedJob",
    "build",
    "submit",
]
