"""A fixed global batch across resizes: a batch sampler that deals an epoch in global batches
of the same size whatever the world, and the gradient accumulation that trains them.

An optimizer step then means the same at 3, 4 or 7 workers: the mean gradient of the same
``global_batch`` samples (the plan is :mod:`~elasticjob.worker_runtime.elastic.batch_plan`).
Use it as a ``DataLoader``'s ``batch_sampler`` and take one optimizer step per global batch::

    batches = hvd.elastic.GlobalBatchSampler(dataset, global_batch=256, micro_batch=32)
    loader = DataLoader(dataset, batch_sampler=batches)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, batches=batches, epoch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for i, (x, y) in enumerate(loader):
                micro = batches.micro_batch(i)
                with hvd.elastic.accumulate(micro, model):
                    (loss_fn(model(x), y) * micro.loss_scale).backward()
                if micro.last:
                    optimizer.step()
                    optimizer.zero_grad()
                    batches.record_step()
                    state.commit()
            state.epoch += 1
            batches.set_epoch(state.epoch)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sized
from typing import Any

from torch.utils.data import Sampler

from elasticjob.worker_runtime.elastic.batch_plan import MicroBatch, plan_step, step_sizes
from elasticjob.worker_runtime.elastic.epoch_order import Progress, epoch_order
from elasticjob.worker_runtime.elastic.sampler import RankAndSize, runtime_rank_and_size
from elasticjob.worker_runtime.training import step_weight

logger = logging.getLogger(__name__)


class GlobalBatchSampler(Sampler[list[int]]):
    """Deals each epoch in global batches of ``global_batch`` samples (the last one of an
    epoch holds what is left), every sample exactly once, whatever the world size.

    The epoch's order is that of :class:`~elasticjob.worker_runtime.elastic.ElasticSampler`
    (a permutation of ``seed + epoch``, or the identity), and global batch ``s`` of the epoch
    is always the same samples, positions ``s * global_batch ...`` of it: a resize changes
    who trains them, in how many micro-batches of at most ``micro_batch`` samples, never what
    a step trains. Progress counts whole global batches (:meth:`record_step`), so a round that
    ends in the middle of one (a failure, a host update) trains it again from its start.

    It yields this rank's micro-batches (lists of dataset indices) of the global batches
    left in the round; :meth:`micro_batch` says what the ``i``-th of a pass over them is: its
    loss scale (the micro-batch's mean loss times it makes the accumulated, rank-averaged
    gradient the mean over the global batch) and whether it ends the global batch. Reduce
    gradients only then (:func:`accumulate`). Call :meth:`reset` when the world changes
    (a ``TorchState`` holding the sampler does), :meth:`set_epoch` when an epoch ends.

    Args:
        dataset: anything with a length; only ``len(dataset)`` is used.
        global_batch: samples of one optimizer step, over all ranks.
        micro_batch: the most samples one rank trains in one forward and backward pass.
        shuffle: draw a new permutation each epoch; otherwise use the dataset order.
        seed: base seed of the permutation; must be the same on every rank.
        rank_and_size: returns ``(rank, world_size)``; by default the worker runtime's.
    """

    def __init__(
        self,
        dataset: Sized,
        global_batch: int,
        micro_batch: int,
        shuffle: bool = True,
        seed: int = 0,
        rank_and_size: RankAndSize | None = None,
    ) -> None:
        super().__init__()
        if global_batch < 1 or micro_batch < 1:
            raise ValueError(
                f"global_batch and micro_batch must be >= 1, got {global_batch} and {micro_batch}"
            )
        self._dataset = dataset
        self.global_batch = global_batch
        self.micro_batch_limit = micro_batch
        self._shuffle = shuffle
        self._seed = seed
        self._rank_and_size: RankAndSize = rank_and_size or runtime_rank_and_size
        self._epoch = 0
        self._order = self._epoch_order()
        self._processed_at_reset = 0
        self._steps: list[int] = []  # samples of each global batch left in the round
        self._steps_done = 0
        self._micros: list[tuple[MicroBatch, list[int]]] = []
        self._first_micro: list[int] = []  # index in _micros of each step's first
        self._pass_start = 0
        self._rank, self._world = 0, 1
        self.reset()

    @property
    def epoch(self) -> int:
        """The current epoch; it selects the permutation."""
        return self._epoch

    @property
    def processed_num(self) -> int:
        """Samples of the epoch trained in whole global batches by the whole world."""
        return self._processed_at_reset + sum(self._steps[: self._steps_done])

    @property
    def steps_left(self) -> int:
        """Global batches of the epoch not trained yet."""
        return len(self._steps) - self._steps_done

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per rank of the next global batch (0 when the epoch is done)."""
        if not self.steps_left:
            return 0
        return self._micros[self._first_micro[self._steps_done]][0].count

    def reset(self) -> None:
        """Re-read rank and world size and plan the global batches left in the epoch."""
        rank, world = self._rank_and_size()
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"invalid rank {rank} for world size {world}")
        self._processed_at_reset = self.processed_num
        self._rank, self._world = rank, world
        self._steps = step_sizes(len(self._order) - self._processed_at_reset, self.global_batch)
        self._steps_done = 0
        self._micros, self._first_micro = [], []
        start = self._processed_at_reset
        for step, samples in enumerate(self._steps):
            plan = plan_step(samples, self.micro_batch_limit, world)
            self._first_micro.append(len(self._micros))
            for micro, positions in zip(
                plan.micro_batches(step, rank), plan.positions(rank), strict=True
            ):
                self._micros.append((micro, [self._order[start + p] for p in positions]))
            start += samples
        self._pass_start = 0
        # The loss scales do the weighting: the reducers average with equal weights.
        step_weight.set_source(None)
        logger.debug(
            "global batch sampler reset: epoch %d, rank %d of %d, %d processed, "
            "%d global batches of %d left, %d micro-batches on this rank",
            self._epoch,
            rank,
            world,
            self._processed_at_reset,
            len(self._steps),
            self.global_batch,
            len(self._micros),
        )

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches of the global batches not recorded yet; :meth:`micro_batch`
        numbers them from this pass's first."""
        self._pass_start = self._next_micro()
        return iter([indices for _, indices in self._micros[self._pass_start :]])

    def __len__(self) -> int:
        """Micro-batches :meth:`__iter__` yields now."""
        return len(self._micros) - self._next_micro()

    def micro_batch(self, i: int) -> MicroBatch:
        """The ``i``-th micro-batch (from 0) of the current pass over the sampler.

        Raises:
            IndexError: the pass has fewer micro-batches.
        """
        index = self._pass_start + i
        if i < 0 or index >= len(self._micros):
            raise IndexError(f"micro-batch {i} of a pass of {len(self._micros) - self._pass_start}")
        return self._micros[index][0]

    def record_step(self) -> None:
        """One more global batch is trained (the optimizer stepped on it)."""
        if not self.steps_left:
            raise RuntimeError("record_step() past the last global batch of the epoch")
        self._steps_done += 1

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning with its own permutation, then :meth:`reset`."""
        self._epoch = epoch
        self._order = self._epoch_order()
        self._processed_at_reset = 0
        self._steps, self._steps_done = [], 0
        self.reset()

    def state_dict(self) -> dict[str, int | bool]:
        """Progress in whole global batches; identical on all ranks."""
        return Progress(self._epoch, self.processed_num, self._seed, self._shuffle).state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict` (or an ``ElasticSampler``'s), then
        :meth:`reset`.

        Raises:
            ValueError: a key is missing, a value has the wrong type, or ``processed_num`` does
                not fit the dataset.
        """
        progress = Progress.read(state, len(self._dataset))
        progress.warn_if_order_differs(self._seed, self._shuffle)
        self._seed, self._shuffle, self._epoch = progress.seed, progress.shuffle, progress.epoch
        self._order = self._epoch_order()
        self._processed_at_reset = progress.processed_num
        self._steps, self._steps_done = [], 0
        self.reset()

    def _next_micro(self) -> int:
        if not self.steps_left:
            return len(self._micros)
        return self._first_micro[self._steps_done]

    def _epoch_order(self) -> list[int]:
        return epoch_order(len(self._dataset), self._shuffle, self._seed, self._epoch)


@contextlib.contextmanager
def accumulate(micro: MicroBatch, *reducers: Any) -> Iterator[None]:
    """Run one micro-batch's backward pass so that gradients are reduced only at the last
    micro-batch of its global batch, and accumulate locally before.

    ``reducers`` are what reduces the gradients: a DDP model (torch's or the elastic
    ``DistributedDataParallel``: ``no_sync()`` before the last), an FSDP2 module
    (``set_requires_gradient_sync``), a ``DistributedOptimizer`` (its backward passes per
    step set to the global batch's micro-batches at the first).

    Raises:
        TypeError: a reducer is none of these.
    """
    with contextlib.ExitStack() as stack:
        for reducer in reducers:
            if hasattr(reducer, "set_backward_passes_per_step"):
                if micro.first:
                    reducer.set_backward_passes_per_step(micro.count)
            elif hasattr(reducer, "set_requires_gradient_sync"):
                reducer.set_requires_gradient_sync(micro.last)
            elif hasattr(reducer, "no_sync"):
                if not micro.last:
                    stack.enter_context(reducer.no_sync())
            else:
                raise TypeError(
                    f"accumulate() got {type(reducer).__name__}: give the DDP model, the FSDP2 "
                    "module or the DistributedOptimizer that reduces the gradients"
                )
        yield
