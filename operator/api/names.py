"""The names of the ElasticJob API: its group, version and kind, the CRD's name, and the
labels and worker container of a job's pods."""

from __future__ import annotations

GROUP = "elasticjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ElasticJob"
PLURAL = "elasticjobs"
SINGULAR = "elasticjob"
SHORT_NAMES = ("ej",)
CRD_NAME = f"{PLURAL}.{GROUP}"

LABEL_JOB_NAME = f"{GROUP}/job-name"
"""Label on every pod of a job: the ElasticJob's name."""
LABEL_ROLE = f"{GROUP}/role"
"""Label on every pod of a job: its role (``worker``)."""
ROLE_WORKER = "worker"
LABEL_HEALTH_CHECK = f"{GROUP}/health-check"
"""Label on a pod of a job with ``spec.healthCheck``: ``Pending`` until it passed its check,
then ``Passed`` (a pod that fails is deleted). Only a pod without it, or ``Passed``, joins."""

WORKER_CONTAINER = "worker"
"""Name of the container the worker runtime runs in, when the template has several."""
GPU_RESOURCE = "nvidia.com/gpu"


def worker_labels(job_name: str) -> dict[str, str]:
    """The labels of a job's worker pods."""
    return {LABEL_JOB_NAME: job_name, LABEL_ROLE: ROLE_WORKER}


def worker_selector(job_name: str) -> str:
    """The label selector of a job's worker pods, as ``status.selector`` carries it."""
    return ",".join(f"{key}={value}" for key, value in worker_labels(job_name).items())
