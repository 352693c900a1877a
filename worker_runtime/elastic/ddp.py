"""``hvd.elastic.DistributedDataParallel``: a ``torch`` DDP model that follows the rounds.

``torch.nn.parallel.DistributedDataParallel`` binds itself to the process group it was built
on; every elastic round has a new one. The wrapper kept by the script builds a fresh DDP
around the same module whenever the round has changed (at the first use in the new round)
and lets go of the old one when its group is destroyed, so that nothing but the group's own
teardown holds a broken group.

Gradients are reduced by a comm hook through the round's group
(:meth:`~elasticjob.worker_runtime.rounds.process_group.RoundGroup.future`): a backward pass waiting
for a dead peer fails as soon as the driver says a member failed, like every collective of
this runtime, instead of waiting out the collective timeout. The hook computes the weighted
average of :mod:`~elasticjob.worker_runtime.training.step_weight`
(``sum(w_r * g_r) / sum(w_r)``, the
weight travelling as one extra element of each bucket), so that uneven last batches planned
by ``ElasticSampler(batch_size=...)`` are averaged per sample; and the last bucket carries
the rank's host-update vote, so that ``state.commit()`` after the step needs no collective of
its own to check for host updates.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDistributedDataParallel

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.rounds.host_updates import VOTE_DTYPES
from elasticjob.worker_runtime.training import step_weight

logger = get_logger(__name__)


class DistributedDataParallel:
    """Keeps ``torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)`` built on the
    current round's group.

    Call it like the module; other attributes (``no_sync``, ``train``, ``parameters``...)
    are those of the DDP of the current round, built on first use in each round. ``module``
    is the wrapped module: give it, or this wrapper, to ``TorchState`` (both save and sync
    the module's weights).

    ``init_sync`` defaults to False: ``elastic.run`` syncs the weights from rank 0 whenever a
    round needs it, and DDP's own initial sync is a blocking collective that a peer's death
    would hold until the collective timeout. Other collectives DDP issues itself (buffer
    broadcasts in ``forward``, the one-time bucket rebuild at the second iteration of each
    round) are not the hook's and wait out the timeout when a peer dies; gradients, the bulk
    of the traffic, do not.

    Backward passes under ``no_sync()`` reduce nothing and are not weighted: with
    ``ElasticSampler(batch_size=...)``, take one optimizer step per backward pass.

    Raises:
        ValueError: ``process_group`` is given (the round's group is the only one).
    """

    def __init__(self, module: torch.nn.Module, **ddp_kwargs: Any) -> None:
        if "process_group" in ddp_kwargs:
            raise ValueError(
                "process_group cannot be given: the elastic DistributedDataParallel reduces "
                "over the current round's group"
            )
        self.module = module
        self._kwargs: dict[str, Any] = {"init_sync": False, **ddp_kwargs}
        self._ddp: TorchDistributedDataParallel | None = None
        self._round = 0
        self._weight: float | None = None
        current().group.on_destroy(self._release)

    @property
    def wrapped(self) -> TorchDistributedDataParallel:
        """The ``torch`` DDP of the current round (built now if the round changed)."""
        runtime = current()
        if self._ddp is None or self._round != runtime.round:
            self._ddp = None
            ddp = TorchDistributedDataParallel(self.module, **self._kwargs)
            # torch checks the hook's annotations against its own classes, and the names
            # here are strings (postponed annotations): hand it an unannotated callable.
            ddp.register_comm_hook(None, lambda _state, bucket: self._reduce_bucket(bucket))
            self._ddp, self._round, self._weight = ddp, runtime.round, None
            logger.debug("DistributedDataParallel built for round %d", runtime.round)
        return self._ddp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def _release(self) -> None:
        """The round's group is being destroyed: drop the DDP built on it."""
        self._ddp = None

    def _reduce_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's comm hook: the weighted average of one bucket over the round's group."""
        runtime = current()
        if self._weight is None:  # the first bucket of a backward pass
            self._weight = step_weight.pass_weight()
        weight = self._weight
        grads = bucket.buffer()
        votes = bucket.is_last() and grads.dtype in VOTE_DTYPES
        extras = [weight, float(runtime.host_update_vote())] if votes else [weight]
        flat = torch.cat(
            [grads * weight, torch.tensor(extras, dtype=grads.dtype, device=grads.device)]
        )
        if bucket.is_last():
            self._weight = None
            step_weight.pass_done()
        n = grads.numel()
        work = dist.all_reduce(flat, async_op=True)

        def average(done: torch.futures.Future[object]) -> torch.Tensor:
            done.value()  # raises the group's error
            if votes:
                runtime.settle_host_update_vote(float(flat[n + 1]) / runtime.slot.size)
            total = float(flat[n])
            reduced = flat[:n]
            # Only padding everywhere (never planned by the sampler): nothing was trained.
            return reduced.div_(total) if total > 0 else reduced.zero_()

        return runtime.group.future(work).then(average)
