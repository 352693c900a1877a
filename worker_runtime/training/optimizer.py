"""``DistributedOptimizer``: gradients averaged across the round, reduced while backward runs.

The optimizer object is kept (its class becomes a subclass of its own class) and its
parameters get backward hooks (:mod:`~elasticjob.worker_runtime.training.gradient_reducer`):
buckets of
gradients (:mod:`~elasticjob.worker_runtime.training.gradient_buckets`) are reduced as soon as they
are ready, overlapping the rest of backward, and ``backward()`` returns with every gradient
reduced (after ``backward_passes_per_step`` passes). ``step()`` then only steps; it reduces
first whatever backward did not (gradients set by hand, a rank whose backward reached no
parameter, a step taken before ``backward_passes_per_step`` passes).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.process_sets import ProcessSet, global_process_set
from elasticjob.worker_runtime.collectives.reduction_ops import Average, ReduceOp, torch_op
from elasticjob.worker_runtime.training.gradient_buckets import (
    DEFAULT_BUCKET_CAP_MB,
    FIRST_BUCKET_CAP_BYTES,
    ParamInfo,
    plan_buckets,
    split_groups,
)
from elasticjob.worker_runtime.training.gradient_reducer import GradientReducer, Reduction

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


class DistributedMixin:
    """Mixed into the wrapped optimizer's own class, so ``isinstance`` checks, learning-rate
    schedulers and ``state_dict`` keep working."""

    _ej_reducer: GradientReducer
    _ej_synchronized_at: int | None
    _ej_should_synchronize: bool

    def synchronize(self) -> None:
        """Wait until every gradient is reduced across the round (reducing those backward
        did not), e.g. before clipping or unscaling gradients. Then take the step inside
        :meth:`skip_synchronize`."""
        reducer = self._ej_reducer
        if not reducer.reduced:
            reducer.reduce()
        self._ej_synchronized_at = reducer.reductions

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this context reduces nothing (after :meth:`synchronize`)."""
        self._ej_should_synchronize = False
        try:
            yield
        finally:
            self._ej_should_synchronize = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Reduce once every ``passes`` backward passes from now on."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes}")
        self._ej_reducer.passes_per_step = passes
        self._ej_reducer.discard()

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Reduce what backward did not (unless inside :meth:`skip_synchronize`), then take
        the wrapped optimizer's step."""
        reducer = self._ej_reducer
        if self._ej_should_synchronize:
            if self._ej_synchronized_at == reducer.reductions:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(): the gradients are not reduced again; "
                    "take the step inside skip_synchronize()",
                    stacklevel=2,
                )
            if not reducer.reduced:
                reducer.reduce()
        self._ej_synchronized_at = None
        reducer.consume()
        current().count_step()
        return super().step(closure)  # type: ignore[misc, no-any-return]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; refused between the backward passes of one
        step."""
        if self._ej_reducer.open_passes():
            raise RuntimeError(
                "optimizer.zero_grad() between the backward passes of one step: with "
                "backward_passes_per_step > 1, call it after step() or synchronize()"
            )
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def forget_reduction(self) -> None:
        """Forget any reduction under way or done for the coming step (a restore after a
        failed round: the next step reduces the next backward's gradients)."""
        self._ej_reducer.discard()
        self._ej_synchronized_at = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state, forgetting any reduction under way."""
        self.forget_reduction()
        super().load_state_dict(state_dict)  # type: ignore[misc]


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters that require a gradient, in registration order."""
    seen: set[int] = set()
    params = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def _named(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None
) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of ``optimizer`` with its name: from ``named_parameters``, checked
    as Horovod checks them, or Horovod's ``allreduce.noname.<group>.<index>``."""
    if named_parameters is None:
        return [
            (f"allreduce.noname.{i}.{j}", param)
            for i, group in enumerate(optimizer.param_groups)
            for j, param in enumerate(group["params"])
        ]
    named = list(named_parameters)
    if any(not isinstance(pair, tuple) for pair in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), usually "
            "produced by model.named_parameters()"
        )
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(
            "Parameter names in named_parameters must be unique. Found duplicates: "
            + ", ".join(duplicates)
        )
    named_ids = {id(param) for _, param in named}
    unnamed = [id(p) for g in optimizer.param_groups for p in g["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not "
            f"named. Python object ids: {', '.join(map(str, unnamed))}"
        )
    return named


def _group_indices(
    params: Sequence[torch.Tensor], num_groups: int, groups: int | Sequence[Sequence[Any]] | None
) -> list[list[int]] | None:
    """Horovod's ``groups`` (a count, or lists of parameters) as lists of indices."""
    if groups is None and num_groups:
        groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, int):
        return split_groups(len(params), groups)
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in group if id(p) in index] for group in groups]


def DistributedOptimizer(
    optimizer: _Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compression.none] | type[Compression.fp16] = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> _Optimizer:
    """Make ``optimizer`` reduce gradients across all ranks (default: average) as backward
    produces them.

    The optimizer object is kept (its state too); its class becomes a subclass of its own
    class, with Horovod's ``synchronize()``, ``skip_synchronize()`` and
    ``set_backward_passes_per_step()``. Gradients travel in buckets of about
    ``bucket_cap_mb`` megabytes (the first of them 1 MB at most, as in DDP), launched during
    backward in reverse registration order, or in Horovod's explicit ``groups`` (a count, or
    lists of parameters; ``num_groups`` is the older spelling of a count). Over
    ``backward_passes_per_step`` passes they accumulate locally (summed, as in Horovod) and
    are reduced once, at the end of the last pass. A parameter whose gradient is None on a
    rank is reduced as zeros there; sparse gradients are reduced as dense ones.
    ``named_parameters`` is checked as Horovod checks it (pairs, unique names, naming every
    parameter of the optimizer); the buckets are matched by order, not by these names. With a
    ``process_set``, its members reduce over the set (each bucket a named collective of the
    set); on a rank outside it the optimizer steps on the rank's own gradients, as Horovod's.

    Raises:
        ValueError: ``gradient_predivide_factor`` with an ``op`` other than Average,
            ``backward_passes_per_step`` < 1, or ``named_parameters`` that are not unique
            ``(name, parameter)`` pairs naming every parameter.
        ValueError: a process set not registered in this round.
        NotImplementedError: ``op=Adasum``.
    """
    named = _named(optimizer, named_parameters)
    if process_set is not global_process_set and process_set.included() is None:
        raise ValueError(
            f"DistributedOptimizer(process_set={process_set}): the set is not registered in "
            "this round (hvd.add_process_set)"
        )
    torch_op(op)  # refuses Adasum by name now, not in the middle of a backward pass
    if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor needs op=Average")
    # Outside the set the optimizer steps on this rank's own gradients (as Horovod's).
    params = _parameters(optimizer) if process_set.included() is not False else []
    plan = plan_buckets(
        [ParamInfo(p.numel(), p.dtype) for p in params],
        int(bucket_cap_mb * 1024 * 1024),
        _group_indices(params, num_groups, groups),
        first_cap_bytes=FIRST_BUCKET_CAP_BYTES,
    )
    reduction = Reduction(
        op,
        None if compression is Compression.none else compression,
        gradient_predivide_factor,
    )
    reducer = GradientReducer(
        params,
        plan,
        reduction,
        backward_passes_per_step,
        sparse_as_dense=sparse_as_dense,
        process_set=None if process_set is global_process_set else process_set,
    )
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (DistributedMixin, base), {})
    wrapped: Any = optimizer
    wrapped._ej_reducer = reducer
    wrapped._ej_synchronized_at = None
    wrapped._ej_should_synchronize = True
    # Horovod's name of each parameter, which scripts read (for logging, say).
    wrapped._parameter_names = {param: name for name, param in named}
    return optimizer
