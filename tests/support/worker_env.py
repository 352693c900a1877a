"""A launcher's environment for a worker: every variable a worker's configuration needs."""

from __future__ import annotations

from elasticjob import wire

FULL_ENV = {
    wire.ENV_RENDEZVOUS_URL: "http://127.0.0.1:7000",
    wire.ENV_JOB: "demo",
    wire.ENV_TOKEN: "secret",
    wire.ENV_HOSTNAME: "127.0.1.7",
    wire.ENV_LOCAL_RANK: "1",
}
