"""The model, optimizer and data of ``ddp_worker.py``, shared with the test that replays its
trajectory on one process."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

SAMPLES = 97
BATCH_SIZE = 4
FEATURES = 6
LR = 0.05
MOMENTUM = 0.5


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def build_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(SAMPLES, FEATURES, generator=generator)
    return features, features.sum(dim=1, keepdim=True).sin()


class Indexed(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Sample ``i`` is ``(x_i, y_i, i)``."""

    def __init__(self) -> None:
        self.features, self.targets = data()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.features[index], self.targets[index], index
