"""How reducescatter splits rows among ranks (as Horovod: the first ``rows % size`` ranks get
one more) and how alltoall validates its splits."""

from __future__ import annotations

import pytest
import torch

from elasticjob.worker_runtime.collectives.scatter import _send_splits, rows_of


@pytest.mark.parametrize(("rows", "size"), [(7, 3), (2, 3), (0, 2), (6, 3), (1, 1)])
def test_rows_of_tile_dimension_0_in_rank_order(rows: int, size: int) -> None:
    parts = [rows_of(rank, rows, size) for rank in range(size)]
    assert [first for first, _ in parts] == [sum(n for _, n in parts[:r]) for r in range(size)]
    counts = [n for _, n in parts]
    assert sum(counts) == rows
    assert counts == sorted(counts, reverse=True) and max(counts) - min(counts) <= 1


def test_alltoall_splits() -> None:
    tensor = torch.zeros(6, 2)
    assert _send_splits(tensor, None, 3) == [2, 2, 2]
    assert _send_splits(tensor, torch.tensor([1, 0, 5]), 3) == [1, 0, 5]
    with pytest.raises(ValueError, match="not a multiple"):
        _send_splits(tensor, None, 4)
    for bad in ([1, 2], [7, -1, 0], [1, 1, 1]):
        with pytest.raises(ValueError, match="adding up"):
            _send_splits(tensor, bad, 3)
