"""What ``elastic.run`` rolls back from and what fails the worker, and when a new round
syncs the state."""

from __future__ import annotations

import pytest
import torch.distributed

from elasticjob.worker_runtime.elastic.run import (
    is_collective_failure,
    raised_in_torch_distributed,
    sync_wanted,
)
from elasticjob.worker_runtime.exceptions import HorovodInternalError

BROKEN = "a member of round 3 failed (driver notice)"


@pytest.mark.parametrize(
    ("exc", "broken", "expected"),
    [
        (HorovodInternalError("collective failed"), None, True),
        (HorovodInternalError("collective failed"), BROKEN, True),
        # A DDP backward pass whose comm hook failed: torch's own RuntimeError.
        (RuntimeError("Got the following error ...: HorovodInternalError: ..."), BROKEN, True),
        # The same type while the group is healthy is the script's own error.
        (RuntimeError("shape mismatch"), None, False),
        # Not a RuntimeError: the script's error, even in a broken round.
        (ValueError("bad value"), BROKEN, False),
        (KeyError("missing"), BROKEN, False),
    ],
)
def test_is_collective_failure(exc: Exception, broken: str | None, expected: bool) -> None:
    assert is_collective_failure(exc, broken) is expected


def test_a_failure_raised_inside_torch_distributed_is_told_apart() -> None:
    """FSDP2's own collectives fail inside ``torch.distributed``: such a failure waits for the
    driver's verdict; one raised by the script itself does not."""
    with pytest.raises(ValueError) as inside:
        torch.distributed.get_rank(group=object())  # type: ignore[arg-type]
    assert raised_in_torch_distributed(inside.value)
    assert not raised_in_torch_distributed(RuntimeError("the script's own error"))


@pytest.mark.parametrize(
    ("required", "rebuilt_every_round", "resume_pending", "expected"),
    [
        # The driver says the live states are equal (no newcomer, no rollback).
        (False, False, False, False),
        # Newcomers, or a rollback.
        (True, False, False, True),
        # A sharded state: its model is rebuilt over every round's group.
        (False, True, False, True),
        # A fresh process with a checkpoint folder (standalone): the sync loads it.
        (False, False, True, True),
        (True, True, True, True),
    ],
)
def test_sync_wanted(
    required: bool, rebuilt_every_round: bool, resume_pending: bool, expected: bool
) -> None:
    assert sync_wanted(required, rebuilt_every_round, resume_pending) is expected
