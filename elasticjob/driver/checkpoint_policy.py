"""A job's durable checkpoint policy, as both front ends give it to the workers.

The launcher (``elasticjob-run --checkpoint-dir ...``) and the operator (``spec.checkpoint``)
build a :class:`CheckpointPolicy`; its :meth:`~CheckpointPolicy.worker_env` is what each
worker process is told (rank 0 writes the committed state to the folder, a fresh rank 0
loads the newest complete checkpoint there), and a configured policy turns the driver's
fallback on (:attr:`~elasticjob.driver.api.DriverSettings.checkpoint_fallback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from elasticjob import wire

DEFAULT_KEEP: Final = 3
"""How many complete checkpoints are kept when the policy does not say."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where the workers write checkpoints, how often, and how many they keep: every
    ``every_commits`` commits, or at the first commit ``interval_s`` seconds after the
    previous checkpoint (exactly one of the two is set)."""

    directory: str
    every_commits: int = 0
    interval_s: float = 0.0
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        if not self.directory:
            raise ValueError("the checkpoint folder must not be empty")
        if self.every_commits < 0 or not (math.isfinite(self.interval_s) and self.interval_s >= 0):
            raise ValueError(
                "checkpoint frequencies must be >= 0, got every "
                f"{self.every_commits} commits and {self.interval_s} s"
            )
        if (self.every_commits > 0) == (self.interval_s > 0):
            raise ValueError(
                "a checkpoint policy writes either every N commits or every S seconds: "
                "give exactly one"
            )
        if self.keep < 1:
            raise ValueError(f"at least 1 checkpoint must be kept, got {self.keep}")

    def worker_env(self) -> dict[str, str]:
        """The worker contract's checkpoint variables (``elasticjob.wire``)."""
        return {
            wire.ENV_CHECKPOINT_DIR: self.directory,
            wire.ENV_CHECKPOINT_EVERY_COMMITS: str(self.every_commits),
            wire.ENV_CHECKPOINT_INTERVAL: f"{self.interval_s:g}",
            wire.ENV_CHECKPOINT_KEEP: str(self.keep),
        }
