"""The bucket plan of ``DistributedOptimizer``: which gradients travel in one allreduce, and
in which order the buckets are launched.

Backward computes the gradients of the last layers first, so the plan walks the parameters
in reverse registration order and fills one open bucket per dtype until it holds at least
``cap_bytes`` (the first bucket of each dtype closes at a smaller size, as DDP's does, so
that communication starts early in the backward pass). With explicit groups (Horovod's
``groups`` / ``num_groups``), each group is a bucket of its own (one per dtype it holds),
whatever its size. Buckets are launched strictly in plan order, on every rank, which is what
lets ranks whose gradients become ready in different orders (a parameter unused on one rank)
still match their collectives: the plan is ordered by the walk position of each bucket's
last parameter, when it is normally ready.

Everything here is a pure function of the parameters' sizes and dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

DEFAULT_BUCKET_CAP_MB = 25.0
"""Horovod's fusion threshold and DDP's bucket cap."""
FIRST_BUCKET_CAP_BYTES = 1024 * 1024
"""DDP's cap of the first bucket."""


@dataclass(frozen=True)
class ParamInfo:
    """What the plan needs of one parameter (that requires a gradient)."""

    numel: int
    dtype: torch.dtype


@dataclass(frozen=True)
class Bucket:
    """Parameters (indices into the registration-order list) reduced as one flat buffer."""

    params: tuple[int, ...]
    dtype: torch.dtype


def _nbytes(info: ParamInfo) -> int:
    return info.numel * torch.empty((), dtype=info.dtype).element_size()


def split_groups(count: int, num_groups: int) -> list[list[int]]:
    """Horovod's ``num_groups``: ``count`` parameters in registration order, split into
    ``num_groups`` contiguous groups whose sizes differ by one at most (the first larger)."""
    if num_groups <= 0:
        raise ValueError(f"num_groups must be > 0, got {num_groups}")
    base, extra = divmod(count, num_groups)
    groups, start = [], 0
    for g in range(num_groups):
        size = base + (1 if g < extra else 0)
        if size:
            groups.append(list(range(start, start + size)))
        start += size
    return groups


def plan_buckets(
    params: Sequence[ParamInfo],
    cap_bytes: int,
    groups: Sequence[Sequence[int]] | None = None,
    first_cap_bytes: int | None = None,
) -> tuple[Bucket, ...]:
    """The buckets of ``params`` (in registration order) in launch order.

    Without ``groups``: reverse registration order, one open bucket per dtype, closed once it
    holds ``cap_bytes`` or more (a cap of 0 gives one bucket per parameter); the first bucket
    of each dtype closes at ``min(first_cap_bytes, cap_bytes)`` already. With ``groups``
    (disjoint lists of indices; a parameter in none is a group of its own, as in Horovod):
    one bucket per group and dtype.

    Raises:
        ValueError: a group names an unknown index, or an index twice.
    """
    walk = list(reversed(range(len(params))))
    position = {index: step for step, index in enumerate(walk)}
    members: list[list[int]] = []
    if groups is None:
        first_cap = cap_bytes if first_cap_bytes is None else min(first_cap_bytes, cap_bytes)
        open_by_dtype: dict[torch.dtype, tuple[list[int], int]] = {}
        closed: set[torch.dtype] = set()
        for index in walk:
            info = params[index]
            bucket, size = open_by_dtype.get(info.dtype, ([], 0))
            bucket.append(index)
            size += _nbytes(info)
            if size >= (cap_bytes if info.dtype in closed else first_cap):
                members.append(bucket)
                closed.add(info.dtype)
                open_by_dtype.pop(info.dtype, None)
            else:
                open_by_dtype[info.dtype] = (bucket, size)
        members.extend(bucket for bucket, _ in open_by_dtype.values())
    else:
        seen: set[int] = set()
        for group in groups:
            for index in group:
                if index not in position or index in seen:
                    raise ValueError(f"groups: parameter {index} is unknown or appears twice")
                seen.add(index)
        whole = [list(g) for g in groups if g] + [[i] for i in walk if i not in seen]
        for group in whole:
            by_dtype: dict[torch.dtype, list[int]] = {}
            for index in sorted(group, key=position.__getitem__):
                by_dtype.setdefault(params[index].dtype, []).append(index)
            members.extend(by_dtype.values())
    members.sort(key=lambda bucket: max(position[i] for i in bucket))
    return tuple(Bucket(tuple(bucket), params[bucket[0]].dtype) for bucket in members)
