"""What the elastic samplers share: an epoch's order of the dataset and the progress through
it that they commit.

Each epoch has one fixed order (a permutation drawn from ``seed + epoch``, or the identity),
and the samples processed so far are always a prefix of it, so a sampler's whole progress is
``(epoch, processed_num)``, the same on every rank and valid for any world size.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

STATE_KEYS = ("epoch", "processed_num", "seed", "shuffle")
"""The keys of a sampler's ``state_dict``."""


def epoch_order(size: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The order of ``range(size)`` in ``epoch``: a permutation drawn from a generator seeded
    with ``seed + epoch``, or the identity when ``shuffle`` is false."""
    if not shuffle:
        return list(range(size))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


@dataclass(frozen=True)
class Progress:
    """A sampler's committed progress (its ``state_dict``)."""

    epoch: int
    processed_num: int
    seed: int
    shuffle: bool

    def state_dict(self) -> dict[str, int | bool]:
        """JSON-serialisable, identical on all ranks."""
        return {
            "epoch": self.epoch,
            "processed_num": self.processed_num,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    @classmethod
    def read(cls, state: Mapping[str, Any], dataset_size: int) -> Progress:
        """Check a saved ``state_dict`` against the dataset.

        Raises:
            ValueError: a key is missing, a value has the wrong type, or ``processed_num``
                does not fit the dataset.
        """
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing!r}")
        epoch, processed, seed = (_require_int(state, k) for k in STATE_KEYS[:3])
        shuffle = state["shuffle"]
        if not isinstance(shuffle, bool):
            raise ValueError(f"sampler state 'shuffle' must be a bool, got {shuffle!r}")
        if not 0 <= processed <= dataset_size:
            raise ValueError(
                f"sampler state has processed_num {processed}, outside 0..{dataset_size} "
                "for this dataset"
            )
        return cls(epoch, processed, seed, shuffle)

    def warn_if_order_differs(self, seed: int, shuffle: bool) -> None:
        """Log that the saved order is followed where the sampler was made with another."""
        if (seed, shuffle) != (self.seed, self.shuffle):
            logger.warning(
                "sampler state uses seed %d, shuffle %s instead of seed %d, shuffle %s; "
                "following the state",
                self.seed,
                self.shuffle,
                seed,
                shuffle,
            )


def _require_int(state: Mapping[str, Any], key: str) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"sampler state {key!r} must be an int, got {value!r}")
    return value
