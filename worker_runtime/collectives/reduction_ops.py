"""Horovod's reduction operations (``hvd.Average``, ``hvd.Sum``, ...) and its rules for them,
and what a compression (``hvd.Compression``) is to the collectives that take one."""

from __future__ import annotations

import enum
from typing import Any, Protocol

import torch
import torch.distributed as dist


class ReduceOp(enum.Enum):
    """Reduction operations (Horovod's ``hvd.Average``, ``hvd.Sum``, ...)."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM
"""Accepted as a name only: every reduction given it raises :class:`NotImplementedError`."""

_TORCH_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def torch_op(op: ReduceOp) -> dist.ReduceOp.RedOpType:
    """The ``torch.distributed`` operation behind ``op``; Adasum is refused by name."""
    if op is ReduceOp.ADASUM:
        raise NotImplementedError(
            "op=Adasum is not supported by elasticjob (no Adasum reduction over Gloo or "
            "NCCL groups here); use op=hvd.Average, Horovod's default, instead"
        )
    return _TORCH_OPS[op]


def resolve_op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    """Horovod's rule: ``op`` wins; else ``average=False`` means Sum, anything else Average."""
    if op is not None:
        return op
    return ReduceOp.SUM if average is False else ReduceOp.AVERAGE


class Compressor(Protocol):
    """A compression of Horovod's ``hvd.Compression`` (``none``, ``fp16``)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor: ...
