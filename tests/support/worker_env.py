"""A worker's environment: a launcher's (every variable a worker's configuration needs), or
a standalone process's."""

from __future__ import annotations

import os

import pytest

from elasticjob.worker_contract import (
    ENV_BACKEND,
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_RENDEZVOUS_URL,
    ENV_TOKEN,
)

FULL_ENV = {
    ENV_RENDEZVOUS_URL: "http://127.0.0.1:7000",
    ENV_JOB: "demo",
    ENV_TOKEN: "secret",
    ENV_HOSTNAME: "127.0.1.7",
    ENV_LOCAL_RANK: "1",
}


def standalone_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker variable but the backend, Gloo: these tests train on the CPU, and on a
    machine with CUDA the default (``auto``) would pick NCCL."""
    for name in [n for n in os.environ if n.startswith("ELASTICJOB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(ENV_BACKEND, "gloo")
