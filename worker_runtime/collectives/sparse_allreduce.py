"""Horovod's ``sparse_allreduce_async``: a sparse (COO) tensor reduced across the ranks as the
gather of every rank's indices and values (as Horovod does it), negotiated as one grouped
allgather (``gather.py``).

It returns a function, as Horovod's does, that waits and gives the reduced sparse tensor:
duplicate indices are summed when the result is coalesced, and the values averaged when
``op`` is ``Average``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from elasticjob.worker_runtime.collectives.gather import grouped_allgather_async
from elasticjob.worker_runtime.collectives.handles import synchronize
from elasticjob.worker_runtime.collectives.process_sets import ProcessSet, global_process_set
from elasticjob.worker_runtime.collectives.reduction_ops import ReduceOp


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp | None = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Start reducing the sparse (COO) ``tensor`` across ranks: every rank's indices and
    values are gathered (duplicates are summed when the result is coalesced), and averaged
    when ``op`` is ``Average`` (``None`` sums, as in Horovod). Returns a function that waits
    and gives the reduced sparse tensor, as Horovod's does."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor")
    operation = ReduceOp.SUM if op is None else op  # Horovod averages only for Average
    if operation not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"sparse_allreduce_async supports Average and Sum, not {operation.name}")
    coalesced = tensor.coalesce()
    handle = grouped_allgather_async(
        [coalesced.indices().transpose(0, 1).contiguous(), coalesced.values()], name, process_set
    )
    size = len(process_set.ranks)

    def result() -> torch.Tensor:
        indices, values = synchronize(handle)
        if operation is ReduceOp.AVERAGE:
            values = values / size
        return torch.sparse_coo_tensor(
            indices.transpose(0, 1), values, tensor.shape, device=tensor.device
        ).coalesce()

    return result
