"""The forms of each collective, made from its one description: Horovod's names, signatures
(keyword names and defaults) and return types; in a standalone world of one, the in-place
forms write into their tensors, the others into new ones, and the blocking forms are
differentiable."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

import elasticjob.worker_runtime as hvd

REDUCE = "average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, ps"
COMPRESSED = "average=None, name=None, compression=None, op=None, prescale_factor=1.0, "
SCATTER = "name=None, op=Average, ps, prescale_factor=1.0, postscale_factor=1.0"
SCATTER_COMPRESSED = "name=None, compression=None, op=Average, ps, prescale_factor=1.0, "

SIGNATURES = {
    "allreduce": (f"tensor, {COMPRESSED}postscale_factor=1.0, ps", "torch.Tensor"),
    "allreduce_async": (f"tensor, {REDUCE}", "int"),
    "allreduce_async_": (f"tensor, {REDUCE}", "int"),
    "allreduce_": (f"tensor, {REDUCE}", "torch.Tensor"),
    "grouped_allreduce": (f"tensors, {COMPRESSED}postscale_factor=1.0, ps", "list[torch.Tensor]"),
    "grouped_allreduce_async": (f"tensors, {REDUCE}", "int"),
    "grouped_allreduce_async_": (f"tensors, {REDUCE}", "int"),
    "grouped_allreduce_": (f"tensors, {REDUCE}", "list[torch.Tensor]"),
    "allgather": ("tensor, name=None, ps", "torch.Tensor"),
    "allgather_async": ("tensor, name=None, ps", "int"),
    "grouped_allgather": ("tensors, name=None, ps", "list[torch.Tensor]"),
    "grouped_allgather_async": ("tensors, name=None, ps", "int"),
    "broadcast": ("tensor, root_rank, name=None, ps", "torch.Tensor"),
    "broadcast_async": ("tensor, root_rank, name=None, ps", "int"),
    "broadcast_async_": ("tensor, root_rank, name=None, ps", "int"),
    "broadcast_": ("tensor, root_rank, name=None, ps", "torch.Tensor"),
    "alltoall": (
        "tensor, splits=None, name=None, ps",
        "torch.Tensor | tuple[torch.Tensor, torch.Tensor]",
    ),
    "alltoall_async": ("tensor, splits=None, name=None, ps", "int"),
    "reducescatter": (f"tensor, {SCATTER_COMPRESSED}postscale_factor=1.0", "torch.Tensor"),
    "reducescatter_async": (f"tensor, {SCATTER}", "int"),
    "grouped_reducescatter": (
        f"tensors, {SCATTER_COMPRESSED}postscale_factor=1.0",
        "list[torch.Tensor]",
    ),
    "grouped_reducescatter_async": (f"tensors, {SCATTER}", "int"),
}


def _shown(default: Any) -> str:
    if default is hvd.global_process_set:
        return "global_process_set"
    return default.name.capitalize() if isinstance(default, hvd.ReduceOp) else repr(default)


def _parameters(function: Callable[..., Any]) -> str:
    shown = []
    for parameter in inspect.signature(function).parameters.values():
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, parameter
        if parameter.default is inspect.Parameter.empty:
            shown.append(parameter.name)
        elif parameter.name == "process_set":
            assert parameter.default is hvd.global_process_set
            shown.append("ps")
        else:
            shown.append(f"{parameter.name}={_shown(parameter.default)}")
    return ", ".join(shown)


@pytest.mark.parametrize(("name", "expected"), SIGNATURES.items(), ids=list(SIGNATURES))
def test_each_form_has_horovods_name_and_signature(name: str, expected: tuple[str, str]) -> None:
    function = getattr(hvd, name)
    parameters, returns = expected
    assert function.__name__ == name
    assert _parameters(function) == parameters
    assert inspect.signature(function).return_annotation == returns
    assert function.__doc__


@pytest.mark.usefixtures("runtime_group")
def test_in_place_forms_write_into_their_tensor_and_the_others_do_not() -> None:
    tensor = torch.tensor([1.0, 2.0])
    assert hvd.allreduce_(tensor, op=hvd.Sum, postscale_factor=2.0) is tensor
    assert hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, prescale_factor=2.0)) is tensor
    assert tensor.tolist() == [4.0, 8.0]
    copy = hvd.synchronize(hvd.allreduce_async(tensor, op=hvd.Sum, postscale_factor=0.5))
    assert copy is not tensor and copy.tolist() == [2.0, 4.0] and tensor.tolist() == [4.0, 8.0]
    grouped = [torch.ones(1), torch.tensor([3], dtype=torch.int64)]
    assert all(a is b for a, b in zip(hvd.grouped_allreduce_(grouped), grouped, strict=True))
    assert hvd.broadcast_(tensor, root_rank=0) is tensor
    assert hvd.broadcast(tensor, root_rank=0) is not tensor


@pytest.mark.usefixtures("runtime_group")
def test_alltoall_returns_its_splits_as_asked() -> None:
    rows = torch.arange(3.0)
    assert torch.equal(hvd.alltoall(rows), rows)
    received, splits = hvd.alltoall(rows, splits=[3])
    assert torch.equal(received, rows) and splits.tolist() == [3]
    received, splits = hvd.synchronize(hvd.alltoall_async(rows))
    assert torch.equal(received, rows) and splits.tolist() == [3]


@pytest.mark.parametrize(
    ("collective", "gradient"),
    [
        (lambda x: [hvd.allreduce(x, op=hvd.Sum, postscale_factor=3.0)], 3.0),
        (lambda x: [hvd.allreduce(x, compression=hvd.Compression.fp16)], 1.0),
        (lambda x: hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum), 3.0),
        (lambda x: [hvd.allgather(x)], 1.0),
        (lambda x: hvd.grouped_allgather([x, x]), 2.0),
        (lambda x: [hvd.broadcast(x, root_rank=0)], 1.0),
        (lambda x: [hvd.alltoall(x, splits=[2])[0]], 1.0),
        (lambda x: [hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0)], 2.0),
        (lambda x: hvd.grouped_reducescatter([x], postscale_factor=0.5), 0.5),
    ],
)
@pytest.mark.usefixtures("runtime_group")
def test_blocking_forms_are_differentiable(
    collective: Callable[[torch.Tensor], list[torch.Tensor]], gradient: float
) -> None:
    x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    outputs = collective(x)
    assert all(output.grad_fn is not None for output in outputs)
    sum(output.sum() for output in outputs).backward()  # type: ignore[union-attr]
    assert x.grad is not None and x.grad.tolist() == [[gradient] * 3] * 2
