"""``DistributedOptimizer``: averages gradients across the round before every step."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import Average, ReduceOp, allreduce_

_Optimizer = TypeVar("_Optimizer", bound=torch.optim.Optimizer)


class Compression:
    """Gradient compression for the allreduce (Horovod's ``hvd.Compression``)."""

    class none:
        @staticmethod
        def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
            return tensor, tensor.dtype

        @staticmethod
        def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return tensor

    class fp16:
        @staticmethod
        def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
            if tensor.is_floating_point():
                return tensor.to(torch.float16), tensor.dtype
            return tensor, tensor.dtype

        @staticmethod
        def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return tensor.to(dtype)


class _DistributedMixin:
    """Mixed into the wrapped optimizer's own class, so ``isinstance`` checks, learning-rate
    schedulers and ``state_dict`` keep working."""

    _ej_op: ReduceOp
    _ej_compression: type[Compression.none] | type[Compression.fp16]
    _ej_predivide: float
    param_groups: list[dict[str, Any]]

    def synchronize(self) -> None:
        """Average every gradient across the round: one coalesced allreduce per dtype."""
        grads = [
            p.grad for group in self.param_groups for p in group["params"] if p.grad is not None
        ]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        runtime = current()
        # The ranks' host-update votes ride along with the first exact-enough buffer, so that
        # commit()'s check after this step needs no collective of its own.
        vote_dtype = next(
            (
                d
                for d in by_dtype
                if d in (torch.float32, torch.float64)
                and self._ej_compression is Compression.none
                and self._ej_op in (ReduceOp.AVERAGE, ReduceOp.SUM)
            ),
            None,
        )
        for dtype_of_group, group in by_dtype.items():
            parts = [g.reshape(-1) for g in group]
            if dtype_of_group == vote_dtype:
                parts.append(torch.tensor([runtime.host_update_vote()], dtype=vote_dtype))
            flat = torch.cat(parts)
            compressed, dtype = self._ej_compression.compress(flat)
            allreduce_(
                compressed,
                op=self._ej_op,
                prescale_factor=1.0 / self._ej_predivide,
                postscale_factor=self._ej_predivide,
            )
            flat = self._ej_compression.decompress(compressed, dtype)
            if dtype_of_group == vote_dtype:
                mean = float(flat[-1])
                if self._ej_op is not ReduceOp.AVERAGE:
                    mean /= runtime.slot.size
                runtime.settle_host_update_vote(mean)
            offset = 0
            for grad in group:
                n = grad.numel()
                grad.copy_(flat[offset : offset + n].view_as(grad))
                offset += n

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self.synchronize()
        current().step += 1
        return super().step(closure)  # type: ignore[misc, no-any-return]


def DistributedOptimizer(
    optimizer: _Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compression.none] | type[Compression.fp16] = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
    gradient_predivide_factor: float = 1.0,
) -> _Optimizer:
    """Make ``optimizer`` average gradients across all ranks before each ``step()``.

    The optimizer object is kept (its state too); its class becomes a subclass of its own
    class. Gradients accumulate locally over ``backward_passes_per_step`` backward passes and
    are reduced once, at ``step()``. ``named_parameters`` is accepted for compatibility."""
    del named_parameters, backward_passes_per_step
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (_DistributedMixin, base), {})
    wrapped: Any = optimizer
    wrapped._ej_op = op
    wrapped._ej_compression = compression
    wrapped._ej_predivide = gradient_predivide_factor
    return optimizer
