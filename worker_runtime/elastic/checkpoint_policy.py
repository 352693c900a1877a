"""When rank 0 writes a durable checkpoint: the job's policy and the decision at a commit."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from elasticjob import wire
from elasticjob.worker_runtime.config import env_seconds

DEFAULT_KEEP = 3
"""Complete checkpoints kept when the job does not say."""


def _count(environ: Mapping[str, str], name: str, default: int, least: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RuntimeError(f"{name} must be a whole number, got {raw!r}") from None
    if value < least:
        raise RuntimeError(f"{name} must be >= {least}, got {raw!r}")
    return value


@dataclass(frozen=True)
class CheckpointPolicy:
    """The job's checkpoint policy (from the ``ELASTICJOB_CHECKPOINT_*`` variables)."""

    folder: Path | None = None
    """Where checkpoints are written and loaded from (None: no durable checkpoints)."""
    every_commits: int = 0
    """Write one every this many commits (0: not by count)."""
    interval_s: float = 0.0
    """Write one at the first commit this many seconds after the previous one (0: not by
    time)."""
    keep: int = DEFAULT_KEEP
    """How many complete checkpoints to keep (the newest)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CheckpointPolicy:
        """Read the policy; raises :class:`RuntimeError` naming a malformed variable."""
        folder = environ.get(wire.ENV_CHECKPOINT_DIR)
        return cls(
            folder=Path(folder) if folder else None,
            every_commits=_count(environ, wire.ENV_CHECKPOINT_EVERY_COMMITS, 0, 0),
            interval_s=env_seconds(environ, wire.ENV_CHECKPOINT_INTERVAL, 0.0),
            keep=_count(environ, wire.ENV_CHECKPOINT_KEEP, DEFAULT_KEEP, 1),
        )


def checkpoint_due(
    policy: CheckpointPolicy, commits_since: int, seconds_since: float, writer_busy: bool
) -> bool:
    """Whether the commit just made is written now, ``commits_since`` commits (this one
    included) and ``seconds_since`` seconds after the previous checkpoint (or the start).

    A writer still busy with the previous checkpoint skips the commit rather than blocking
    the step; the next commit is due in its place."""
    if policy.folder is None or writer_busy:
        return False
    by_count = policy.every_commits > 0 and commits_since >= policy.every_commits
    by_time = policy.interval_s > 0 and seconds_since >= policy.interval_s
    return by_count or by_time
