"""A stand-in for the worker runtime's ``(rank, size)`` that the samplers read at each reset
(``rank_and_size=``): mutable between rounds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FixedRank:
    """What the worker runtime would report to one rank: mutable between rounds."""

    rank: int
    size: int

    def __call__(self) -> tuple[int, int]:
        return self.rank, self.size
