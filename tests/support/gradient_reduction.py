"""What the tests of gradient reduction in this process (the standalone runtime) share: a
small model and its backward pass, fixed step weights, and a backward that must raise as
soon as its round is aborted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.training import step_weight

ABORT_AFTER_S = 0.5
RAISED_WITHIN_S = 15.0
"""A backward pass on an aborted group must raise this soon: well before the group's
timeout (40 s), which is what it would wait without the abort; not a measure of speed (a
machine busy with other tests delays the raise by seconds)."""


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def backward(model: Callable[[torch.Tensor], torch.Tensor], seed: int = 1) -> None:
    """One backward pass of ``model`` over a batch of 4 drawn with ``seed``."""
    torch.manual_seed(seed)
    model(torch.randn(4, 3)).square().mean().backward()


class Weights:
    """A step-weight source with fixed weights per pass."""

    def __init__(self, *weights: float) -> None:
        self.start = step_weight.passes()
        self.weights = weights

    def weight(self, passes: int) -> float:
        return self.weights[passes - self.start]


def raises_when_aborted(
    group: RoundGroup, call: Callable[[], None], error: type[Exception], match: str
) -> None:
    """``call`` (blocked on a silent peer of ``group``) raises ``error`` matching ``match``
    as soon as the round is aborted ``ABORT_AFTER_S`` into it, well before its timeout."""
    notice = threading.Timer(ABORT_AFTER_S, group.abort, ["a member of round 1 failed"])
    started = time.monotonic()  # before the timer starts: a busy machine may pause us between
    notice.start()
    with pytest.raises(error, match=match):
        call()
    waited = time.monotonic() - started
    notice.join()
    assert ABORT_AFTER_S <= waited < ABORT_AFTER_S + RAISED_WITHIN_S
