"""Data for the user's script: a noisy linear target, the same on every worker."""

from __future__ import annotations

import torch


def regression_data(samples: int, features: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=generator)
    weights = torch.arange(1.0, features + 1.0).unsqueeze(1)
    y = x @ weights + 0.01 * torch.randn(samples, 1, generator=generator)
    return x, y
