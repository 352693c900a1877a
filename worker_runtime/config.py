"""What a launcher (or the operator) tells a worker through its environment.

The variable names are the worker contract's and live in :mod:`elasticjob.wire`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from elasticjob import wire
from elasticjob.env_values import env_seconds


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's identity in the job and the bounds it works under."""

    rendezvous_url: str
    job: str
    token: str = field(repr=False)
    hostname: str
    local_rank: int
    bind_address: str
    backend: str = "auto"
    collective_timeout_s: float = 60.0
    """Bound on any collective; failures the driver sees abort groups much sooner."""
    round_wait_s: float = 900.0
    """How long a worker waits for its next round before giving up."""
    heartbeat_interval_s: float = 0.0
    """Seconds between heartbeats to the rendezvous service (0: none, the default; the
    driver that evicts silent workers sets it)."""
    orphan_timeout_s: float = 900.0
    """How long the worker keeps running while the rendezvous service is unreachable (its
    launcher or operator is gone), then exits; 0: forever. The default outlasts an operator
    restart; the local launcher sets a short one."""
    defer_sigterm: bool = False
    """Whether the first SIGTERM lets the worker leave at its next host-update check."""
    rendezvous_ca: str | None = None
    """PEM text of the CA an ``https://`` rendezvous URL is verified against (None: the
    system's)."""
    probe_after_s: float = 2.0
    """How long a collective (or forming a round's group) may block before the heartbeat
    thread probes the round's peers and reports those it cannot reach (0: never). Healthy
    steps of 1,024 ranks stay well below it; a slow one only costs a few TCP connects."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerConfig | None:
        """Read the config, or None when the process was not started by a launcher.

        Raises :class:`RuntimeError` naming the variables that are missing, :class:`ValueError`
        naming one that is malformed."""
        url = environ.get(wire.ENV_RENDEZVOUS_URL)
        if not url:
            return None
        missing = [
            name
            for name in (wire.ENV_JOB, wire.ENV_TOKEN, wire.ENV_HOSTNAME, wire.ENV_LOCAL_RANK)
            if not environ.get(name)
        ]
        if missing:
            raise RuntimeError(f"{wire.ENV_RENDEZVOUS_URL} is set but {', '.join(missing)} not")
        hostname = environ[wire.ENV_HOSTNAME]
        return cls(
            rendezvous_url=url,
            job=environ[wire.ENV_JOB],
            token=environ[wire.ENV_TOKEN],
            hostname=hostname,
            local_rank=int(environ[wire.ENV_LOCAL_RANK]),
            bind_address=environ.get(wire.ENV_BIND_ADDRESS, hostname),
            backend=environ.get(wire.ENV_BACKEND, "auto"),
            collective_timeout_s=env_seconds(environ, wire.ENV_COLLECTIVE_TIMEOUT, 60.0),
            round_wait_s=env_seconds(environ, wire.ENV_ROUND_WAIT, 900.0),
            heartbeat_interval_s=env_seconds(environ, wire.ENV_HEARTBEAT_INTERVAL, 0.0),
            orphan_timeout_s=env_seconds(environ, wire.ENV_ORPHAN_TIMEOUT, 900.0),
            defer_sigterm=environ.get(wire.ENV_DEFER_SIGTERM) == "1",
            rendezvous_ca=environ.get(wire.ENV_RENDEZVOUS_CA) or None,
            probe_after_s=env_seconds(environ, wire.ENV_PROBE_AFTER, 2.0),
        )


def resolve_backend(requested: str) -> str:
    """``auto`` means NCCL when CUDA is available, else Gloo."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ValueError(f"backend must be gloo, nccl or auto, got {requested!r}")
    return requested
