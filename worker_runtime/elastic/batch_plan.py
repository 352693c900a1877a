"""How one global batch of a fixed size is trained by a world of any size: a pure plan.

With a fixed global batch an optimizer step means the same whatever the number of workers:
it averages the gradients of the same ``G`` samples. :func:`plan_step` splits the ``G``
samples of one step over ``W`` ranks and, on each rank, into micro-batches of at most ``M``
samples (the most one rank's memory takes), accumulated before the step:

- rank ``r`` trains the step's positions ``r, r + W, r + 2W, ...``: ``ceil(G / W)`` or
  ``floor(G / W)`` samples (uneven worlds: the first ``G mod W`` ranks have one more);
- every rank runs the same number of micro-batches, ``A = ceil(ceil(G / W) / M)`` (the
  gradient accumulation steps; the reduction of the last one is a collective), each rank's
  samples dealt over them as evenly as possible, larger first;
- a micro-batch with no sample (more ranks than samples) trains one padding sample whose
  loss scale is 0;
- the mean loss of a micro-batch of ``b`` samples is scaled by ``b * W / G``: the ranks'
  accumulated gradients, averaged over the ``W`` ranks (as DDP, FSDP2 and
  ``DistributedOptimizer`` do), are then the mean gradient of the ``G`` samples.

When ``W * M * A == G`` every scale is ``1 / A``: the plain loop's ``loss / accumulation``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatch:
    """One forward and backward pass of this rank: part of one global batch."""

    #: The global batch (optimizer step) it belongs to, counted from the sampler's reset.
    step: int
    #: Its number within the global batch, from 0.
    index: int
    #: Micro-batches of that global batch on every rank (its gradient accumulation steps).
    count: int
    #: Real samples (0: one padding sample is trained, with a loss scale of 0).
    size: int
    #: What to multiply the micro-batch's mean loss by.
    loss_scale: float

    @property
    def first(self) -> bool:
        """Whether it starts its global batch (gradients were zeroed after the last step)."""
        return self.index == 0

    @property
    def last(self) -> bool:
        """Whether it ends its global batch: gradients are reduced, then the optimizer steps."""
        return self.index == self.count - 1


@dataclass(frozen=True)
class StepPlan:
    """The split of one global batch of ``samples`` over ``world`` ranks."""

    samples: int
    world: int
    accumulation: int

    def share(self, rank: int) -> int:
        """Samples ``rank`` trains: the step's positions ``rank, rank + world, ...``."""
        return len(range(rank, self.samples, self.world))

    def micro_sizes(self, rank: int) -> tuple[int, ...]:
        """Real samples of each of ``rank``'s micro-batches, larger first."""
        share = self.share(rank)
        base, extra = divmod(share, self.accumulation)
        return tuple(base + (k < extra) for k in range(self.accumulation))

    def loss_scale(self, size: int) -> float:
        """Scale of the mean loss of a micro-batch of ``size`` real samples."""
        return size * self.world / self.samples

    def positions(self, rank: int) -> list[list[int]]:
        """Positions within the step (``0 .. samples - 1``) of each of ``rank``'s
        micro-batches; a micro-batch with no sample holds one padding position (the
        step's first)."""
        mine = list(range(rank, self.samples, self.world))
        out: list[list[int]] = []
        start = 0
        for size in self.micro_sizes(rank):
            out.append(mine[start : start + size] if size else [0])
            start += size
        return out

    def micro_batches(self, step: int, rank: int) -> list[MicroBatch]:
        """``rank``'s micro-batches of this plan, as global batch number ``step``."""
        sizes = self.micro_sizes(rank)
        return [
            MicroBatch(step, k, len(sizes), size, self.loss_scale(size))
            for k, size in enumerate(sizes)
        ]


def plan_step(samples: int, micro_batch: int, world: int) -> StepPlan:
    """The plan of a global batch of ``samples`` over ``world`` ranks whose micro-batches
    hold at most ``micro_batch`` samples.

    Raises:
        ValueError: a non-positive argument.
    """
    if samples < 1 or micro_batch < 1 or world < 1:
        raise ValueError(
            f"a global batch plan needs samples, micro_batch and world >= 1, got "
            f"{samples}, {micro_batch} and {world}"
        )
    return StepPlan(samples, world, math.ceil(math.ceil(samples / world) / micro_batch))


def step_sizes(remaining: int, global_batch: int) -> list[int]:
    """Samples of each global batch of what is left of an epoch: full ones, then the rest."""
    full, rest = divmod(remaining, global_batch)
    return [global_batch] * full + ([rest] if rest else [])
