"""One collective described once (an :class:`Operation`), and the forms of Horovod's API made
from that description: ``*_async`` (into new tensors, a handle), ``*_async_`` and ``*_`` (in
place, a handle or waited for), and the blocking form a script calls, with autograd and
compression.

An operation family's module (``reduce.py``, ``gather.py``, ``broadcast.py``, ``scatter.py``)
writes each operation's signature once, as a function that returns its :class:`Operation`:
this rank's call (negotiated by name, ``negotiation.py``), how it is issued once the ranks
agree, what it returns and its gradient. The forms here give each derived function that
signature, its name and its docstring::

    allreduce_async = async_form(allreduce_operation, "Start reducing a copy ...")

The blocking form runs as an autograd function when a tensor it is given requires a gradient
(and gradients are enabled); otherwise the plain collective runs, with no autograd
bookkeeping. Compression (``hvd.Compression.fp16``) is a cast on either side of the
collective, so gradients flow through it as well.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated, synchronize
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued
from elasticjob.worker_runtime.collectives.negotiation import Negotiation
from elasticjob.worker_runtime.collectives.reduction_ops import Compressor

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

Issue = Callable[[list[torch.Tensor], Sequence[Call], dist.ProcessGroup], Issued]
"""Issues an agreed operation on the negotiated group, given the buffers it works on (its
tensors, or copies of them) and every rank's call; its works, and the function that gives its
outputs (a list of tensors) once they are done."""
Gradient = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], list[torch.Tensor]]
"""The gradients of an operation's tensors, given those of its outputs and its outputs that
are not differentiated (alltoall's received splits)."""


def first(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The result of an operation on one tensor: its one output."""
    return outputs[0]


def listed(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The result of a grouped operation: its outputs, one per tensor."""
    return list(outputs)


def paired(outputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The result of an operation with two outputs (alltoall's rows and splits)."""
    return outputs[0], outputs[1]


@dataclass(frozen=True)
class Operation(Generic[R]):
    """One rank's call of a collective, not yet issued: everything every form of it needs."""

    negotiation: Negotiation
    """Of the process set the operation runs over."""
    name: str | None
    call: Call
    tensors: tuple[torch.Tensor, ...]
    issue: Issue
    form: Callable[[Sequence[torch.Tensor]], R]
    """The blocking and in-place forms' result, from the outputs."""
    writes: bool = False
    """Whether :attr:`issue` writes the outputs into the buffers it is given (the in-place
    forms hand it the tensors themselves, the others copies)."""
    gradient: Gradient | None = None
    """None: the blocking form is not differentiable for these tensors."""
    handle_form: Callable[[Sequence[torch.Tensor]], object] | None = None
    """What ``synchronize`` returns from the outputs, where it is not :attr:`form`'s."""


def _submitted(
    operation: Operation[Any],
    buffers: Sequence[torch.Tensor],
    form: Callable[[Sequence[torch.Tensor]], object],
) -> int:
    """Submit ``operation`` on ``buffers`` to its negotiation; its handle's output is ``form``
    of the outputs."""

    def start(calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        works, outputs = operation.issue(list(buffers), calls, group)
        return works, lambda: form(outputs())

    return negotiated(operation.negotiation, operation.name, operation.call, start)


def _copies(operation: Operation[Any]) -> list[torch.Tensor]:
    """The buffers a form that leaves the tensors as they are gives the operation."""
    if operation.writes:
        return [tensor.detach().clone() for tensor in operation.tensors]
    return list(operation.tensors)


def outputs(operation: Operation[Any]) -> list[torch.Tensor]:
    """``operation`` carried out on copies of its tensors and waited for: its outputs, with no
    autograd bookkeeping (a gradient's collective, a blocking form's forward pass)."""
    found: list[torch.Tensor] = synchronize(_submitted(operation, _copies(operation), listed))
    return found


def _handle(operation: Operation[Any], in_place: bool) -> int:
    """``operation`` submitted on its own tensors (``in_place``: written into) or on copies
    where it would write into them; returns its handle."""
    buffers = operation.tensors if in_place else _copies(operation)
    form = operation.form if operation.handle_form is None else operation.handle_form
    return _submitted(operation, buffers, form)


class _Collective(torch.autograd.Function):
    """An operation's blocking form with its gradient: the tensors are the inputs autograd
    follows; the outputs that are not floating point are not differentiated."""

    @staticmethod
    def forward(
        ctx: Any, operation: Operation[Any], *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        del tensors  # the operation's own, given for autograd to follow
        found = outputs(operation)
        fixed = [t for t in found if not (t.is_floating_point() or t.is_complex())]
        ctx.mark_non_differentiable(*fixed)
        # Saved only where there is something to save: saved tensors are freed by the first
        # backward pass, and a grouped operation's outputs may each be backpropagated alone.
        ctx.fixed = bool(fixed)
        if fixed:
            ctx.save_for_backward(*fixed)
        ctx.gradient = operation.gradient
        return tuple(found)

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> tuple[Any, ...]:
        return None, *ctx.gradient(gradients, ctx.saved_tensors if ctx.fixed else ())


def _tracked(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether autograd follows a collective of ``tensors``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _differentiated(operation: Operation[Any]) -> list[torch.Tensor]:
    """The outputs of ``operation``'s blocking form: through autograd when it follows them."""
    if operation.gradient is None or not _tracked(operation.tensors):
        return outputs(operation)
    found: tuple[torch.Tensor, ...] = _Collective.apply(operation, *operation.tensors)  # type: ignore[no-untyped-call]
    return list(found)


def compressed_outputs(
    compression: type[Compressor] | None,
    tensors: Sequence[torch.Tensor],
    operation_on: Callable[[list[torch.Tensor]], Operation[Any]],
) -> list[torch.Tensor]:
    """The blocking form of the operation ``operation_on`` describes on ``tensors``
    compressed (``hvd.Compression``): its outputs, one per tensor, decompressed."""
    if compression is None:
        return _differentiated(operation_on(list(tensors)))
    sent = [compression.compress(tensor) for tensor in tensors]
    found = _differentiated(operation_on([tensor for tensor, _ in sent]))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(found, sent, strict=True)]


# ---- the forms of Horovod's API ---------------------------------------------------------


def _made(
    form: Callable[P, T], operation: Callable[P, Any], suffix: str, returns: str | None, doc: str
) -> Callable[P, T]:
    """``form`` named after ``operation`` (``allreduce_operation`` and ``_async``:
    ``allreduce_async``), with its signature (returning ``returns``, None: what the operation
    describes) and ``doc``."""
    name = operation.__name__.removesuffix("_operation") + suffix
    signature = inspect.signature(operation)
    described = str(signature.return_annotation).removeprefix("Operation[").removesuffix("]")
    if isinstance(form, types.FunctionType):  # its frames, as tracebacks and the timeline show
        form.__code__ = form.__code__.replace(co_name=name, co_qualname=name)
    form.__name__ = form.__qualname__ = name
    form.__module__ = operation.__module__
    form.__doc__ = doc
    vars(form)["__signature__"] = signature.replace(return_annotation=returns or described)
    return form


def async_form(
    operation: Callable[P, Operation[Any]], doc: str, in_place: bool = False
) -> Callable[P, int]:
    """The ``*_async`` form, the operation into new tensors (``in_place``: the ``*_async_``
    form, into its own), returning its handle."""

    def form(*args: P.args, **kwargs: P.kwargs) -> int:
        return _handle(operation(*args, **kwargs), in_place)

    return _made(form, operation, "_async_" if in_place else "_async", "int", doc)


def in_place_form(operation: Callable[P, Operation[R]], doc: str) -> Callable[P, R]:
    """The ``*_`` form: the operation in place, waited for; returns what it wrote into."""

    def form(*args: P.args, **kwargs: P.kwargs) -> R:
        result: R = synchronize(_handle(operation(*args, **kwargs), in_place=True))
        return result

    return _made(form, operation, "_", None, doc)


def blocking_form(operation: Callable[P, Operation[R]], doc: str) -> Callable[P, R]:
    """The blocking form (differentiable), where it takes the operation's own arguments (no
    compression): returns new tensors."""

    def form(*args: P.args, **kwargs: P.kwargs) -> R:
        described = operation(*args, **kwargs)
        return described.form(_differentiated(described))

    return _made(form, operation, "", None, doc)
