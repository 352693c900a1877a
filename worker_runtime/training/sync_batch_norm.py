"""Horovod's ``SyncBatchNorm``: batch normalization over the whole round's batch.

``torch.nn.SyncBatchNorm`` needs a GPU and waits for its gathers outside this runtime (a
broken round would block it until the collective timeout), so this one is built on the
runtime's own allreduce: in training, each rank contributes the per-channel sum, sum of
squares and count of its batch (batches may differ in size, even be empty), and the backward
pass reduces their gradients the same way. Every rank must run its forward and backward
passes through the same layers in the same order (the usual data-parallel case). In
evaluation, or in a world of one, it is a plain batch normalization.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.reduce import allreduce
from elasticjob.worker_runtime.collectives.reduction_ops import Sum


class _SumAcrossRanks(torch.autograd.Function):
    """Sum a tensor across ranks; its gradient is the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        del ctx
        return allreduce(tensor, op=Sum)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        del ctx
        return allreduce(grad.contiguous(), op=Sum)


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics cover every rank's batch (inputs of
    shape ``(N, C, ...)``); Horovod's signature."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` with the statistics of every rank's batch (in training)."""
        if not self.training or current().slot.size == 1:
            return super().forward(input)
        self._check_input_dim(input)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        count = torch.full((1,), input.numel() // max(channels, 1), dtype=input.dtype)
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count.to(input.device)])
        total: torch.Tensor = _SumAcrossRanks.apply(local)  # type: ignore[no-untyped-call]
        n = total[2 * channels]
        mean = total[:channels] / n
        var = (total[channels : 2 * channels] / n - mean * mean).clamp(min=0)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(n.item()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        output = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        result: torch.Tensor = output
        return result

    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as in torch
                factor = 1.0 / float(self.num_batches_tracked.item())
            else:
                factor = self.momentum
            unbiased = var * (n / (n - 1)) if n > 1 else var
            self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
            self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
