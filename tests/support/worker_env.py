"""A launcher's environment for a worker: every variable a worker's configuration needs."""

from __future__ import annotations

from elasticjob.worker_contract import (
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
