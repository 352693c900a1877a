"""The bucket plan of DistributedOptimizer: one row per rule."""

from __future__ import annotations

import pytest
import torch

from elasticjob.worker_runtime.training.gradient_buckets import (
    Bucket,
    ParamInfo,
    plan_buckets,
    split_groups,
)

F32, F64, F16 = torch.float32, torch.float64, torch.float16


def infos(*specs: tuple[int, torch.dtype]) -> list[ParamInfo]:
    return [ParamInfo(numel, dtype) for numel, dtype in specs]


@pytest.mark.parametrize(
    ("params", "cap_bytes", "groups", "expected"),
    [
        pytest.param(
            infos((10, F32), (10, F32), (10, F32)),
            1000,
            None,
            [((2, 1, 0), F32)],
            id="under the cap: one bucket, reverse registration order",
        ),
        pytest.param(
            infos((10, F32), (10, F32), (10, F32), (10, F32)),
            80,
            None,
            [((3, 2), F32), ((1, 0), F32)],
            id="a bucket closes once it holds the cap",
        ),
        pytest.param(
            infos((1, F32), (100, F32), (1, F32)),
            80,
            None,
            [((2, 1), F32), ((0,), F32)],
            id="a parameter larger than the cap closes its bucket",
        ),
        pytest.param(
            infos((4, F32), (4, F32)),
            0,
            None,
            [((1,), F32), ((0,), F32)],
            id="cap 0: one bucket per parameter",
        ),
        pytest.param(
            infos((10, F32), (10, F64), (10, F32), (10, F64)),
            1000,
            None,
            [((3, 1), F64), ((2, 0), F32)],
            id="one open bucket per dtype, ordered by when their last gradient is ready",
        ),
        pytest.param(
            infos((10, F32), (10, F16), (10, F32)),
            40,
            None,
            [((2,), F32), ((1,), F16), ((0,), F32)],
            id="buckets of several dtypes interleave by when they are ready",
        ),
        pytest.param(
            infos((10, F32), (10, F32), (10, F32), (10, F32)),
            0,
            [[0, 1], [2, 3]],
            [((3, 2), F32), ((1, 0), F32)],
            id="explicit groups ignore the cap",
        ),
        pytest.param(
            infos((10, F32), (10, F32), (10, F32)),
            10**9,
            [[0, 2]],
            [((1,), F32), ((2, 0), F32)],
            id="a parameter in no group is a group of its own",
        ),
        pytest.param(
            infos((10, F32), (10, F64), (10, F32)),
            10**9,
            [[0, 1, 2]],
            [((1,), F64), ((2, 0), F32)],
            id="a group holding two dtypes is a bucket per dtype",
        ),
        pytest.param(infos(), 100, None, [], id="no parameters, no buckets"),
    ],
)
def test_plan_buckets(
    params: list[ParamInfo],
    cap_bytes: int,
    groups: list[list[int]] | None,
    expected: list[tuple[tuple[int, ...], torch.dtype]],
) -> None:
    assert plan_buckets(params, cap_bytes, groups) == tuple(Bucket(*row) for row in expected)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param(
            infos((10, F32), (10, F32), (10, F32), (10, F32)),
            [((3,), F32), ((2, 1), F32), ((0,), F32)],
            id="the first bucket closes at the first cap, the others at the cap",
        ),
        pytest.param(
            infos((10, F64), (10, F32), (10, F32), (10, F32)),
            [((3,), F32), ((2, 1), F32), ((0,), F64)],
            id="the first bucket of each dtype",
        ),
    ],
)
def test_plan_buckets_first_cap(
    params: list[ParamInfo], expected: list[tuple[tuple[int, ...], torch.dtype]]
) -> None:
    got = plan_buckets(params, cap_bytes=80, first_cap_bytes=40)
    assert got == tuple(Bucket(*row) for row in expected)


@pytest.mark.parametrize("groups", [[[0, 5]], [[0], [0, 1]]], ids=["unknown", "twice"])
def test_plan_buckets_refuses_bad_groups(groups: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="unknown or appears twice"):
        plan_buckets(infos((1, F32), (1, F32)), 100, groups)


@pytest.mark.parametrize(
    ("count", "num_groups", "expected"),
    [
        (5, 2, [[0, 1, 2], [3, 4]]),
        (4, 4, [[0], [1], [2], [3]]),
        (2, 3, [[0], [1]]),
        (0, 2, []),
    ],
)
def test_split_groups(count: int, num_groups: int, expected: list[list[int]]) -> None:
    assert split_groups(count, num_groups) == expected


def test_split_groups_needs_a_positive_count() -> None:
    with pytest.raises(ValueError, match="num_groups must be > 0"):
        split_groups(3, 0)
