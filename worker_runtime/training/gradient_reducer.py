"""Gradient reduction driven by backward hooks, so that communication overlaps backward.

Every parameter gets two hooks, which run only when backward accumulates into ``.grad`` (not
for ``torch.autograd.grad``). The one before accumulation, on the parameter's gradient
accumulator, opens a backward pass (the first of a pass asks
:mod:`~elasticjob.worker_runtime.training.step_weight` for its weight, scales gradients by it, and
queues the pass's end with the autograd engine); the one after accumulation marks the
parameter ready, and each bucket of the plan
(:mod:`~elasticjob.worker_runtime.training.gradient_buckets`) whose parameters are all ready is
launched as an asynchronous allreduce, strictly in plan order. A *window* is the
``passes_per_step`` backward passes whose accumulated gradients are reduced once; at the end
of its last pass, the buckets not launched yet (a parameter unused in this pass: its
gradient is zeros, as in Horovod) are launched in order and every bucket is waited for
through the round's group (:mod:`~elasticjob.worker_runtime.collectives.handles`), so a failed round
raises :class:`HorovodInternalError` out of ``backward()`` at once. Gradients are therefore
reduced when ``backward()`` returns, as under DDP, and identical on every rank: an inf on
one rank is an inf everywhere (``GradScaler`` skips the step on every rank or on none).

Average and Sum reductions are weighted: each rank sends ``w * g`` per pass, and every
Average bucket carries two extra elements, the window's summed weight and its pass count, so
that the result is Horovod's ``sum(g_r) / size`` when every weight is 1 and the per-sample
mean ``sum(w_r * g_r) / sum(w_r)`` (per pass) under uneven last batches. The first bucket of
an exact dtype (float32/float64, no compression, Average or Sum) carries the rank's
host-update vote, so the check after the step needs no collective of its own.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import handles
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import ProcessSet, negotiation_of
from elasticjob.worker_runtime.collectives.reduction_ops import Compressor, ReduceOp, torch_op
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.host_updates import VOTE_DTYPES
from elasticjob.worker_runtime.training import step_weight
from elasticjob.worker_runtime.training.gradient_buckets import Bucket

logger = get_logger(__name__)


@dataclass(frozen=True)
class Reduction:
    """How gradients are combined across the round."""

    op: ReduceOp
    compression: type[Compressor] | None
    """None: the buffer travels in its own dtype."""
    predivide: float = 1.0

    @property
    def weighted(self) -> bool:
        """Whether gradients are scaled by the step weight (Average and Sum)."""
        return self.op in (ReduceOp.AVERAGE, ReduceOp.SUM)

    def votes(self, dtype: torch.dtype) -> bool:
        """Whether a bucket of ``dtype`` can carry the host-update vote exactly."""
        return self.weighted and self.compression is None and dtype in VOTE_DTYPES


def result_scale(reduction: Reduction, size: int, weight: float, passes: float) -> float:
    """What a reduced bucket is multiplied by: for Average, the predivide factor back times
    ``passes / (size * weight)`` (the summed weight and pass count of every rank, carried in
    the bucket), so that ``sum(w * g)`` becomes a mean per pass of weight 1; 0 when nothing
    was trained anywhere (all weights 0: padding only). Other ops: 1."""
    if reduction.op is not ReduceOp.AVERAGE:
        return 1.0
    if weight <= 0:
        return 0.0
    return reduction.predivide * passes / (size * weight)


@dataclass
class _Launched:
    bucket: Bucket
    handle: int
    numel: int
    vote: bool


@dataclass
class _Window:
    """The backward passes whose gradients are reduced together, in one round."""

    round: int
    fired: list[int]
    waiting: list[int]
    """Per bucket: parameters not ready yet."""
    passes: int = 0
    weight: float = 0.0
    pass_weight: float = 1.0
    in_pass: bool = False
    launched: list[_Launched] = field(default_factory=list)
    voted: bool = False


class GradientReducer:
    """Reduces the gradients of ``params`` (registration order) bucket by bucket as backward
    produces them; one reduction per ``passes_per_step`` backward passes. Over the round's
    group, in program order; or over ``process_set``'s, each bucket a named collective of
    the set (``DistributedOptimizer.bucket.<b>``), negotiated as the set's others are."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        plan: Sequence[Bucket],
        reduction: Reduction,
        passes_per_step: int,
        sparse_as_dense: bool = False,
        process_set: ProcessSet | None = None,
    ) -> None:
        if passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes_per_step}")
        self.process_set = process_set
        self.params = list(params)
        self.plan = list(plan)
        self.reduction = reduction
        self.passes_per_step = passes_per_step
        self._bucket_of = {i: b for b, bucket in enumerate(self.plan) for i in bucket.params}
        self._window: _Window | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        """Each bucket's flat buffer, reused from window to window while no reduction was
        abandoned (an abandoned one may still be written to by the backend)."""
        self.reduced = False
        """Gradients were reduced since the last :meth:`consume` (the optimizer's step)."""
        self.reductions = 0
        """Windows reduced so far."""
        self._warned_sparse = sparse_as_dense
        ref = weakref.ref(self)
        removables = []
        self._accumulators: list[Any] = []
        """The parameters' gradient accumulators, kept alive so that their hooks stay."""
        for index, param in enumerate(self.params):
            with torch.enable_grad():
                grad_fn: Any = param.view_as(param).grad_fn
                accumulator = grad_fn.next_functions[0][0]
            self._accumulators.append(accumulator)
            removables.append(accumulator.register_prehook(_pre_hook(ref)))
            hooked: Any = param  # torch leaves the registration unannotated
            removables.append(hooked.register_post_accumulate_grad_hook(_post_hook(ref, index)))
        weakref.finalize(self, _remove_all, removables)

    # ---- state ---------------------------------------------------------------------------

    def open_passes(self) -> int:
        """Backward passes accumulated in the current round and not reduced yet."""
        window = self._current_window()
        return 0 if window is None else window.passes

    def discard(self) -> None:
        """Forget the window under way (its launched reductions too) and any reduced flag."""
        self._window = None
        self._buffers.clear()
        self.reduced = False

    def consume(self) -> None:
        """The reduced gradients were used (a step): the next step reduces again."""
        self.reduced = False

    def _current_window(self) -> _Window | None:
        window = self._window
        if window is not None and window.round != current().round:
            logger.debug("dropping gradient reductions of round %d", window.round)
            self.discard()
            return None
        return window

    def _open_window(self) -> _Window:
        window = self._current_window()
        if window is None:
            waiting = [len(bucket.params) for bucket in self.plan]
            window = _Window(current().round, [0] * len(self.params), waiting)
            self._window = window
            self.reduced = False
        return window

    # ---- hooks ---------------------------------------------------------------------------

    def before_accumulation(self, grad: torch.Tensor) -> torch.Tensor | None:
        """A gradient is about to be accumulated: open the pass if it is its first; scale
        the gradient by the pass's weight."""
        window = self._open_window()
        if not window.in_pass:
            window.in_pass = True
            window.pass_weight = step_weight.pass_weight()
            window.passes += 1
            window.weight += window.pass_weight
            engine: Any = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._end_pass)
        if self.reduction.weighted and window.pass_weight != 1.0:
            return grad * window.pass_weight
        return None

    def after_accumulation(self, index: int) -> None:
        """Parameter ``index``'s gradient is accumulated: launch the buckets now ready."""
        window = self._open_window()
        window.fired[index] += 1
        if window.fired[index] == self.passes_per_step:
            window.waiting[self._bucket_of[index]] -= 1
            self._launch_ready(window)

    def _end_pass(self) -> None:
        window = self._window
        if window is None or not window.in_pass:
            return
        window.in_pass = False
        step_weight.pass_done()
        if window.passes >= self.passes_per_step:
            self.reduce()

    # ---- reduction -----------------------------------------------------------------------

    def reduce(self) -> None:
        """Finish the window: launch every bucket not launched yet (in plan order), wait for
        all and write the results into the gradients. A window without any backward pass
        (gradients set by hand, or none on this rank) is reduced as one pass of weight 1."""
        window = self._open_window()
        try:
            if window.passes == 0:
                window.passes, window.weight = 1, 1.0
            for b in range(len(window.launched), len(self.plan)):
                self._launch(window, b)
            for launched in window.launched:
                self._finish(launched, handles.synchronize(launched.handle))
        except BaseException:
            self._buffers.clear()
            raise
        finally:
            self._window = None
        self.reduced = True
        self.reductions += 1

    def _launch_ready(self, window: _Window) -> None:
        while len(window.launched) < len(self.plan) and window.waiting[len(window.launched)] == 0:
            self._launch(window, len(window.launched))

    def _launch(self, window: _Window, b: int) -> None:
        runtime = current()
        reason = runtime.group.errored()
        if reason is not None:
            self.discard()
            raise HorovodInternalError(reason)
        bucket = self.plan[b]
        parts = [self._dense_grad(i).reshape(-1) for i in bucket.params]
        numel = sum(part.numel() for part in parts)
        extras: list[float] = []
        if self.reduction.op is ReduceOp.AVERAGE:
            extras += [window.weight, float(window.passes)]
        vote = self.process_set is None and not window.voted and self.reduction.votes(bucket.dtype)
        if vote:
            extras.append(float(runtime.host_update_vote()))
            window.voted = True
        flat = self._buffer(b, numel + len(extras), bucket.dtype, runtime.device)
        offset = 0
        for part in parts:
            flat[offset : offset + part.numel()].copy_(part)
            offset += part.numel()
        flat[numel:].copy_(torch.tensor(extras, dtype=bucket.dtype))
        if self.reduction.predivide != 1.0:
            flat[:numel].mul_(1.0 / self.reduction.predivide)
        compression = self.reduction.compression
        wire, ctx = (flat, None) if compression is None else compression.compress(flat)
        op = torch_op(self.reduction.op)

        def result() -> torch.Tensor:
            return wire if compression is None else compression.decompress(wire, ctx)

        if self.process_set is None:
            handle = handles.issue([dist.all_reduce(wire, op=op, async_op=True)], result)
        else:

            def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
                return [dist.all_reduce(wire, op=op, group=group, async_op=True)], result

            call = describe("allreduce", [wire], op=self.reduction.op.value)
            negotiation = negotiation_of(self.process_set)
            name = f"DistributedOptimizer.bucket.{b}"
            handle = handles.negotiated(negotiation, name, call, start)
        window.launched.append(_Launched(bucket, handle, numel, vote))

    def _buffer(self, b: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = self._buffers.get(b)
        if buffer is None or buffer.numel() != numel or buffer.device != device:
            buffer = self._buffers[b] = torch.empty(numel, dtype=dtype, device=device)
        return buffer

    def _dense_grad(self, index: int) -> torch.Tensor:
        param = self.params[index]
        if param.grad is None:
            # Unused on this rank (maybe not on others): every rank sends the same buffers.
            param.grad = torch.zeros_like(param)
        grad = param.grad
        if grad.is_sparse:
            if not self._warned_sparse:
                self._warned_sparse = True
                warnings.warn(
                    "DistributedOptimizer reduces sparse gradients as dense tensors (pass "
                    "sparse_as_dense=True to say that this is expected)",
                    stacklevel=2,
                )
            return grad.to_dense()
        return grad

    def _finish(self, launched: _Launched, flat: torch.Tensor) -> None:
        runtime = current()
        size = runtime.slot.size if self.process_set is None else len(self.process_set.ranks)
        n = launched.numel
        grads = flat[:n]
        if self.reduction.op is ReduceOp.AVERAGE:
            totals = (float(flat[n]), float(flat[n + 1]))
            scale = result_scale(self.reduction, size, *totals)
        else:
            scale = result_scale(self.reduction, size, 0.0, 0.0)
        if launched.vote:
            runtime.settle_host_update_vote(float(flat[-1]) / size)
        offset = 0
        with torch.no_grad():
            for i in launched.bucket.params:
                param = self.params[i]
                grad = param.grad
                assert grad is not None
                part = grads[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
                if grad.is_sparse:
                    param.grad = (part * scale).to(grad.device).to_sparse()
                elif scale != 1.0 and grad.device == part.device:
                    torch.mul(part, scale, out=grad)  # one pass: scale and copy back
                else:
                    grad.copy_(part)
                    if scale != 1.0:
                        grad.mul_(scale)


def _pre_hook(ref: weakref.ref[GradientReducer]) -> Any:
    def hook(grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        reducer = ref()
        scaled = None if reducer is None else reducer.before_accumulation(grads[0])
        return None if scaled is None else (scaled,)

    return hook


def _post_hook(ref: weakref.ref[GradientReducer], index: int) -> Any:
    def hook(_param: torch.Tensor) -> None:
        reducer = ref()
        if reducer is not None:
            reducer.after_accumulation(index)

    return hook


def _remove_all(removables: list[Any]) -> None:
    for removable in removables:
        removable.remove()
