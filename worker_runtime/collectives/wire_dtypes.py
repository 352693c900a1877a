"""Tensors as the round's backend carries them, and Horovod's scaling of reduced tensors.

Horovod's collectives take every dtype on the CPU: ``uint8``, ``int8``, ``int16``, ``int32``,
``int64``, ``float16``, ``bfloat16``, ``float32``, ``float64`` and ``bool``. A backend that lacks
one (Gloo has no ``int16``; NCCL no ``int16`` nor ``bool``) carries it as a wider type that
holds every value exactly, and the result is cast back: a broadcast or a gather moves the same
values, a sum wraps around as the narrow type's would (it is the same sum modulo its width),
and on booleans a sum or a maximum is a logical or, a minimum or a product a logical and.

:func:`scale_` is Horovod's pre- and post-scaling (and an average's division): a floating
tensor is multiplied in its dtype; an integer one is multiplied in double precision and
truncated toward zero, as Horovod's ``ScaleBuffer`` does.
"""

from __future__ import annotations

from typing import Final

import torch

from elasticjob.worker_runtime.basics import current

_WIDER: Final[dict[str, dict[torch.dtype, torch.dtype]]] = {
    "gloo": {torch.int16: torch.int32},
    "nccl": {torch.int16: torch.int32, torch.bool: torch.uint8},
}
"""By backend, the dtypes it lacks and the wider ones that carry them."""


def wire_dtype(dtype: torch.dtype, backend: str) -> torch.dtype:
    """The dtype ``backend`` carries a tensor of ``dtype`` as."""
    return _WIDER.get(backend, {}).get(dtype, dtype)


def on_wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s data as the round's group carries it: its own storage when it is
    contiguous on the round's device in a dtype the backend has, else a contiguous copy there
    (NCCL refuses a strided tensor), widened where the backend lacks its dtype."""
    runtime = current()
    dtype = wire_dtype(tensor.dtype, runtime.group.backend)
    if tensor.device == runtime.device and tensor.is_contiguous() and dtype == tensor.dtype:
        return tensor.data
    # ``to`` gives the tensor itself where the device and dtype are already right, strided
    # as it is (an expanded gradient, a transposed view): ``contiguous`` copies those.
    return tensor.data.to(runtime.device, dtype, memory_format=torch.contiguous_format).contiguous()


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply ``tensor`` by ``factor`` in place, as Horovod scales a buffer: in its own
    floating dtype, or for integers (and booleans) in double precision, truncated toward
    zero."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(torch.trunc(tensor.to(torch.float64) * factor))
