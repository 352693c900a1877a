"""This rank's weight in the gradient average of the backward pass being reduced.

Data-parallel averaging gives every rank the same weight, which is right while every rank
trains a full batch. At the end of an epoch (or of a round) the samples still to do rarely
split evenly; instead of padding with duplicates, the elastic sampler hands ranks uneven last
batches and says how much of a full batch each rank's batch is. Whoever reduces gradients
(``DistributedOptimizer``, the elastic ``DistributedDataParallel`` hook) then computes
``sum(w_r * g_r) / sum(w_r)`` instead of the plain mean.

The contract between the two sides:

- a weight source (the sampler) registers itself with :func:`set_source`; it maps the index
  of a backward pass since the source's own start (:meth:`WeightSource.weight`) to a weight in
  ``[0, 1]``: the fraction of a full batch that pass trains on this rank;
- a reducer calls :func:`pass_weight` once per backward pass, before its first gradient of
  that pass leaves the rank or is accumulated, and :func:`pass_done` once that pass's
  gradients are in (reduced, or accumulated locally under ``backward_passes_per_step``).
  Without a source every weight is 1.0, and the weighted average equals the plain mean.

Every rank of a round must reduce the same way: reducers always carry the weight along with
the gradients (one extra element per buffer), whether or not a source is registered.
"""

from __future__ import annotations

import threading
from typing import Protocol


class WeightSource(Protocol):
    """Knows the weight of each backward pass it planned (the elastic sampler)."""

    def weight(self, passes: int) -> float:
        """Weight in ``[0, 1]`` of this rank's backward pass number ``passes`` (0-based),
        counted by :func:`passes` since the source last marked its start."""
        ...


_lock = threading.Lock()
_source: WeightSource | None = None
_passes = 0


def set_source(source: WeightSource | None) -> None:
    """Make ``source`` give the weights of the next backward passes (None: weight 1.0)."""
    global _source
    with _lock:
        _source = source


def passes() -> int:
    """Backward passes done in this process so far (a monotonic counter): a source keeps
    the value it saw at its start and subtracts it."""
    with _lock:
        return _passes


def pass_weight() -> float:
    """This rank's weight for the backward pass being reduced now."""
    with _lock:
        source, done = _source, _passes
    if source is None:
        return 1.0
    weight = float(source.weight(done))
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"a step weight must lie in [0, 1], got {weight}")
    return weight


def pass_done() -> None:
    """The backward pass being reduced is done: the next call of :func:`pass_weight` is for
    the next one."""
    global _passes
    with _lock:
        _passes += 1
