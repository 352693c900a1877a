"""Horovod's broadcast, in all its forms: ``broadcast`` (blocking and differentiable),
``broadcast_async``, ``broadcast_async_`` and ``broadcast_``.

The operation is described once (:func:`broadcast_operation`), with Horovod's signature; its
forms are made from that description (``operation_forms.py``). ``root_rank`` is a global rank,
as in Horovod. The gradient of the input is the output's gradient averaged over the ranks on
the root, zero elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.issuing import start_broadcast_
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.operation_forms import (
    Operation,
    async_form,
    blocking_form,
    first,
    in_place_form,
    outputs,
)
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.reduce import allreduce_operation
from elasticjob.worker_runtime.collectives.reduction_ops import Average


def broadcast_operation(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Operation[torch.Tensor]:
    """Root's ``tensor`` on every rank of ``process_set``."""
    negotiation = negotiation_of(process_set)

    def issue(
        buffers: list[torch.Tensor], _calls: Sequence[Call], group: dist.ProcessGroup
    ) -> Issued:
        pending = start_broadcast_(buffers[0], root_rank, group)
        return [pending.work], lambda: [pending.finish()]

    def gradient(
        gradients: Sequence[torch.Tensor], _fixed: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        average = allreduce_operation(gradients[0], None, None, Average, 1.0, 1.0, process_set)
        (averaged,) = outputs(average)
        if current().slot.rank != root_rank:  # a global rank, as in Horovod
            averaged = torch.zeros_like(averaged)
        return [averaged]

    call = describe("broadcast", [tensor], root=root_rank)
    return Operation(
        negotiation, name, call, (tensor,), issue, first, writes=True, gradient=gradient
    )


broadcast_async = async_form(
    broadcast_operation,
    "Start broadcasting root's ``tensor`` into a copy; ``synchronize`` returns the copy.",
)
broadcast_async_ = async_form(
    broadcast_operation,
    "Start overwriting ``tensor`` with root's value in place; ``synchronize`` returns it.",
    in_place=True,
)
broadcast_ = in_place_form(broadcast_operation, "Overwrite ``tensor`` with root's value, in place.")
broadcast = blocking_form(broadcast_operation, "Return a new tensor holding root's ``tensor``.")
