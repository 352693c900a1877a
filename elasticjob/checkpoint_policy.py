"""A job's durable checkpoint policy: where rank 0 writes the committed state, how often, and
how many checkpoints it keeps; and the decision, at each commit, whether one is written now.

Both sides of the worker contract share it. The front ends build it (``elasticjob-run
--checkpoint-dir ...``, an ElasticJob's ``spec.checkpoint``), each checking its own input and
naming its own flag or field, and hand it to each worker as the ``ELASTICJOB_CHECKPOINT_*``
variables (:meth:`CheckpointPolicy.worker_env`); a configured policy also turns the driver's
durable fallback on. The worker runtime reads it back (:meth:`CheckpointPolicy.from_env`) and
asks :func:`checkpoint_due` at every commit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob import wire
from elasticjob.env_values import env_seconds, env_whole

DEFAULT_KEEP: Final = 3
"""How many complete checkpoints are kept when the policy does not say."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """Checkpoints under ``folder``: one every ``every_commits`` commits and/or at the first
    commit ``interval_s`` seconds after the previous one (0: not by that measure; with
    neither, only an explicit ``state.checkpoint()`` writes one), the newest ``keep`` kept."""

    folder: str
    every_commits: int = 0
    interval_s: float = 0.0
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        if not self.folder:
            raise ValueError("the checkpoint folder must not be empty")
        if self.every_commits < 0 or not (math.isfinite(self.interval_s) and self.interval_s >= 0):
            raise ValueError(
                "checkpoint frequencies must be >= 0, got every "
                f"{self.every_commits} commits and {self.interval_s} s"
            )
        if self.keep < 1:
            raise ValueError(f"at least 1 checkpoint must be kept, got {self.keep}")

    def worker_env(self) -> dict[str, str]:
        """The worker contract's checkpoint variables (``elasticjob.wire``)."""
        return {
            wire.ENV_CHECKPOINT_DIR: self.folder,
            wire.ENV_CHECKPOINT_EVERY_COMMITS: str(self.every_commits),
            wire.ENV_CHECKPOINT_INTERVAL: f"{self.interval_s:g}",
            wire.ENV_CHECKPOINT_KEEP: str(self.keep),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CheckpointPolicy | None:
        """The policy a worker was given; None without a checkpoint folder. Raises
        :class:`ValueError` naming a malformed variable."""
        folder = environ.get(wire.ENV_CHECKPOINT_DIR)
        if not folder:
            return None
        return cls(
            folder=folder,
            every_commits=env_whole(environ, wire.ENV_CHECKPOINT_EVERY_COMMITS, 0, least=0),
            interval_s=env_seconds(environ, wire.ENV_CHECKPOINT_INTERVAL, 0.0),
            keep=env_whole(environ, wire.ENV_CHECKPOINT_KEEP, DEFAULT_KEEP, least=1),
        )


def checkpoint_due(
    policy: CheckpointPolicy, commits_since: int, seconds_since: float, writer_busy: bool
) -> bool:
    """Whether the commit just made is written now, ``commits_since`` commits (this one
    included) and ``seconds_since`` seconds after the previous checkpoint (or the start).

    A writer still busy with the previous checkpoint skips the commit rather than blocking
    the step; the next commit is due in its place."""
    if writer_busy:
        return False
    by_count = policy.every_commits > 0 and commits_since >= policy.every_commits
    by_time = policy.interval_s > 0 and seconds_since >= policy.interval_s
    return by_count or by_time
