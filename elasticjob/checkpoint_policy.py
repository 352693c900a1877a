"""A job's durable checkpoint policy: where rank 0 writes the committed state, how often, and
how many checkpoints it keeps; and the decision, at each commit, whether one is written now.

Both sides of the worker contract share it. The front ends build it (``elasticjob-run
--checkpoint-dir ...``, an ElasticJob's ``spec.checkpoint``), each checking its own input and
naming its own flag or field, and hand it to each worker as a field of the worker contract
(``elasticjob.worker_contract``: the ``ELASTICJOB_CHECKPOINT_*`` variables); a configured
policy also turns the driver's durable fallback on. The worker runtime reads it back and asks
:func:`checkpoint_due` at every commit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

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
