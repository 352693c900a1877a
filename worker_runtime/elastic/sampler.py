"""A data sampler for elastic data-parallel training that trains every sample exactly once.

Each epoch has one fixed order of the dataset (a seeded permutation, or the identity). The
samples processed so far always form a prefix of that order, so the sampler's whole progress is
one integer, ``processed_num``, which every rank can compute for itself and which survives any
change of the world size: after a failure the job restores the last committed integer, after a
graceful resize it keeps the current one, and in both cases the ranks split what is left anew.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

from torch.utils.data import Sampler

from elasticjob.worker_runtime.elastic.epoch_order import Progress, epoch_order
from elasticjob.worker_runtime.training import step_weight

logger = logging.getLogger(__name__)

RankAndSize = Callable[[], tuple[int, int]]
"""Returns ``(rank, world_size)`` of the calling worker in the current round."""


def runtime_rank_and_size() -> tuple[int, int]:
    """Asks the worker runtime for this worker's rank and the world size."""
    runtime = importlib.import_module("elasticjob.worker_runtime")
    return int(runtime.rank()), int(runtime.size())


def plan_share(remaining: int, rank: int, size: int, batch_size: int | None) -> tuple[int, int]:
    """How ``rank``'s share of a round of ``remaining`` samples over ``size`` ranks is run:
    ``(real, padding)``, its real samples (positions ``rank, rank + size, ...``) and the padding
    samples after them that let it run as many steps as the rank with the most.

    Without a batch size every share is padded to ``ceil(remaining / size)`` samples. With one,
    every rank runs ``ceil(ceil(remaining / size) / batch_size)`` steps of up to
    ``batch_size`` samples; a rank whose real samples end one step early gets one padding
    sample for that step (its weight is 0), never more.
    """
    real = len(range(rank, remaining, size))
    longest = math.ceil(remaining / size)
    if batch_size is None:
        return real, longest - real
    steps = math.ceil(longest / batch_size)
    return real, steps - math.ceil(real / batch_size)


def batch_weight(real: int, padding: int, batch_size: int, batch: int) -> float:
    """Weight of batch number ``batch`` of a share planned by :func:`plan_share`: the
    fraction of a full batch it trains (0.0 for the padding sample); 1.0 past the plan."""
    steps = math.ceil(real / batch_size) + padding
    if batch >= steps:
        return 1.0
    return min(max(real - batch * batch_size, 0), batch_size) / batch_size


class ElasticSampler(Sampler[int]):
    """Splits one epoch of a dataset among a changing set of ranks, each sample exactly once.

    The epoch's order ``P`` is a permutation of ``range(len(dataset))`` drawn from a generator
    seeded with ``seed + epoch`` (or the identity when ``shuffle`` is false). The processed
    samples are always ``P[:processed_num]``.

    :meth:`reset` reads the rank ``r`` and world size ``s`` and splits the ``n`` samples still
    to do, ``remaining = P[processed_num:]``, with a stride: rank ``r`` gets positions
    ``r, r + s, r + 2s, ...`` of ``remaining``, ``ceil(n / s)`` of them. Positions past the end
    wrap around (``remaining[p % n]``) so that every rank runs the same number of steps; these
    padding samples are trained but never counted as processed. Once every rank has processed
    its first ``m`` samples, the processed positions are exactly ``[0, min(m * s, n))``, a prefix
    of ``remaining`` and therefore of ``P``.

    Given a ``batch_size`` ``B`` (the ``DataLoader``'s), the sampler pads nothing with
    duplicates. Every rank still runs the same number of steps, ``ceil(ceil(n / s) / B)``, but
    the last step's batches may be short, and a rank with no sample left for the last step
    gets one padding sample instead, whose weight is 0. The sampler is then the
    :mod:`~elasticjob.worker_runtime.training.step_weight` source: backward pass ``k`` since
    the last
    :meth:`reset` has the weight ``real samples of batch k / B``, and the gradient reducers
    (``DistributedOptimizer``, the elastic ``DistributedDataParallel``) average
    ``sum(w_r * g_r) / sum(w_r)``, so a script training with a plain mean loss trains every
    sample of the epoch exactly once, with the weight of a sample everywhere the same. Use it
    with ``DataLoader(dataset, batch_size=B, sampler=sampler)`` (``drop_last`` false): the
    shares are laid out so that the loader's batches are the planned ones. The sampler most
    recently reset gives the weights.

    Lockstep assumption: training is synchronous data parallel, so all ranks record the same
    number of samples between two resets. Each rank therefore computes the same global
    ``processed_num`` locally, with no communication; :meth:`state_dict` is identical on all
    ranks and a worker that leaves takes nothing with it that the others do not know.

    Progress within a round is reported with :meth:`record_batch` or :meth:`record_indices`.
    Call :meth:`reset` whenever the world changes (after restoring committed state or after a
    resize) and :meth:`set_epoch` when an epoch ends, before committing; calling
    :meth:`set_epoch` again for an epoch already under way starts that epoch over.

    Args:
        dataset: anything with a length; only ``len(dataset)`` is used.
        shuffle: draw a new permutation each epoch; otherwise use the dataset order.
        seed: base seed of the permutation; must be the same on every rank.
        rank_and_size: returns ``(rank, world_size)``; by default the worker runtime's
            ``rank()`` and ``size()``, looked up at each :meth:`reset`.
        batch_size: the loader's batch size: plan uneven last batches weighted for the
            gradient average instead of padding with duplicates (see above).
    """

    def __init__(
        self,
        dataset: Sized,
        shuffle: bool = True,
        seed: int = 0,
        rank_and_size: RankAndSize | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._dataset = dataset
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._seed = seed
        self._rank_and_size: RankAndSize = rank_and_size or runtime_rank_and_size
        self._epoch = 0
        self._order: list[int] = []
        # Samples of the epoch processed before the current round started.
        self._processed_at_reset = 0
        # Samples of the current round still to do, split among the ranks, and this rank's share.
        self._round_size = 0
        self._rank = 0
        self._num_replicas = 1
        self._partition: list[int] = []
        self._real = 0
        # Leading samples of this rank's share recorded as processed in the current round.
        self._local_done = 0
        # step_weight.passes() when the round started: backward pass k of the round trains
        # batch k of the share.
        self._passes_at_reset = 0
        self._build_order()
        self.reset()

    @property
    def epoch(self) -> int:
        """The current epoch; it selects the permutation."""
        return self._epoch

    @property
    def shuffle(self) -> bool:
        """Whether each epoch uses a fresh permutation."""
        return self._shuffle

    @property
    def seed(self) -> int:
        """Base seed of the per-epoch permutations."""
        return self._seed

    @property
    def batch_size(self) -> int | None:
        """The batch size the shares are planned for (None: padded with duplicates)."""
        return self._batch_size

    @property
    def rank(self) -> int:
        """This worker's rank, as read at the last :meth:`reset`."""
        return self._rank

    @property
    def num_replicas(self) -> int:
        """The world size, as read at the last :meth:`reset`."""
        return self._num_replicas

    @property
    def num_samples(self) -> int:
        """Length of this rank's share of the round, padding included."""
        return len(self._partition)

    @property
    def num_real_samples(self) -> int:
        """Leading samples of this rank's share that are not padding: ``num_samples`` minus the
        padding samples at its end, which are trained but never counted as processed."""
        return self._real

    @property
    def total_size(self) -> int:
        """Samples the whole world runs in this round, padding included."""
        size, n = self._num_replicas, self._round_size
        return sum(sum(plan_share(n, r, size, self._batch_size)) for r in range(size))

    @property
    def processed_num(self) -> int:
        """Samples of the epoch processed by the whole world, padding excluded."""
        # In lockstep every rank has run the same steps: a rank done with its whole share
        # (padding included) knows that every rank is, whatever the length of its own share.
        longest = math.ceil(self._round_size / self._num_replicas)
        done = longest if self._local_done >= self.num_samples else self._local_done
        return self._processed_at_reset + min(done * self._num_replicas, self._round_size)

    def weight(self, passes: int) -> float:
        """Weight of this rank's backward pass number ``passes`` of the
        :mod:`~elasticjob.worker_runtime.training.step_weight` counter (a ``WeightSource``): that of
        batch ``passes - start`` of the round, counted from the last :meth:`reset`."""
        assert self._batch_size is not None
        padding = self.num_samples - self._real
        return batch_weight(self._real, padding, self._batch_size, passes - self._passes_at_reset)

    @property
    def remaining_indices(self) -> list[int]:
        """Dataset indices of the epoch not processed yet, in epoch order."""
        return self._order[self.processed_num :]

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch`` from its beginning with its own permutation, then :meth:`reset`."""
        self._epoch = epoch
        self._processed_at_reset = 0
        self._local_done = 0
        self._build_order()
        self.reset()

    def reset(self) -> None:
        """Re-reads rank and world size and splits the samples still to do among the ranks.

        Progress recorded so far in the round is kept: it becomes part of ``processed_num``.
        """
        rank, size = self._rank_and_size()
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"invalid rank {rank} for world size {size}")
        self._processed_at_reset = self.processed_num
        self._local_done = 0
        self._rank = rank
        self._num_replicas = size
        remaining = self._order[self._processed_at_reset :]
        n = len(remaining)
        self._round_size = n
        real, padding = plan_share(n, rank, size, self._batch_size)
        self._real = real
        positions = [rank + i * size for i in range(real + padding)]
        self._partition = [remaining[p % n] for p in positions]
        if self._batch_size is not None:
            self._passes_at_reset = step_weight.passes()
            step_weight.set_source(self)
        logger.debug(
            "sampler reset: epoch %d, rank %d of %d, %d processed, %d remaining, "
            "%d real and %d padding samples on this rank",
            self._epoch,
            rank,
            size,
            self._processed_at_reset,
            n,
            real,
            padding,
        )

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """Dataset indices of batch ``batch_idx`` of this rank's share of the round.

        Batches count from the start of the round (the last :meth:`reset`); a batch past the end
        is short or empty.
        """
        self._check_batch(batch_idx, batch_size)
        start = batch_idx * batch_size
        return self._partition[start : start + batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records that this rank processed batches ``0..batch_idx`` of its share of the round.

        Batches count from the last :meth:`reset`, as in :meth:`get_indices`. Recorded progress
        never moves backwards: recording an earlier batch again changes nothing.
        """
        self._check_batch(batch_idx, batch_size)
        done = min((batch_idx + 1) * batch_size, self.num_samples)
        self._local_done = max(self._local_done, done)

    def record_indices(self, indices: Iterable[int]) -> None:
        """Records that this rank processed ``indices``, the next samples of its share in order.

        Raises:
            ValueError: ``indices`` are not the next unrecorded samples of this rank's share.
        """
        recorded = [int(index) for index in indices]
        start = self._local_done
        end = start + len(recorded)
        expected = self._partition[start:end]
        if end > self.num_samples or recorded != expected:
            raise ValueError(
                f"rank {self._rank} recorded indices {recorded!r}, but the next unrecorded "
                f"samples of its share (positions {start}..{end - 1} of {self.num_samples}) are "
                f"{expected!r}; record batches in the order the sampler yields them"
            )
        self._local_done = end

    def state_dict(self) -> dict[str, int | bool]:
        """The sampler's progress; JSON-serialisable and identical on all ranks."""
        return Progress(self._epoch, self.processed_num, self._seed, self._shuffle).state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores progress saved by :meth:`state_dict`, then :meth:`reset`.

        Raises:
            ValueError: a key is missing, a value has the wrong type, or ``processed_num`` does
                not fit the dataset.
        """
        progress = Progress.read(state, len(self._dataset))
        progress.warn_if_order_differs(self._seed, self._shuffle)
        self._seed = progress.seed
        self._shuffle = progress.shuffle
        self._epoch = progress.epoch
        self._build_order()
        self._processed_at_reset = progress.processed_num
        self._local_done = 0
        self._round_size = 0
        self.reset()

    def __iter__(self) -> Iterator[int]:
        """Yields this rank's share of the round after the samples already recorded."""
        return iter(self._partition[self._local_done :])

    def __len__(self) -> int:
        """Number of samples :meth:`__iter__` yields now."""
        return self.num_samples - self._local_done

    def _build_order(self) -> None:
        self._order = epoch_order(len(self._dataset), self._shuffle, self._seed, self._epoch)

    @staticmethod
    def _check_batch(batch_idx: int, batch_size: int) -> None:
        if batch_idx < 0 or batch_size < 1:
            raise ValueError(
                f"batch_idx must be >= 0 and batch_size >= 1, got {batch_idx} and {batch_size}"
            )
