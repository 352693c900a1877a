"""Worker script of the tests of Horovod's further collective API (async handles, grouped
reductions, alltoall, reducescatter, barrier, join, SyncBatchNorm, process sets, build flags,
the script's timeline): writes what every rank observed to ``<out>/rank-<rank>.json``.

Inputs are simple functions of the rank, so the test computes the expected values for any
world size; SyncBatchNorm is checked here against a plain BatchNorm on the gathered batch.
With ``--abort``, the job instead runs an elastic loop in which rank 2 of the first round
SIGKILLs itself while rank 0 waits in a barrier and rank 1 on an async handle; every rank
appends JSON lines (with wall-clock times) to ``<out>/events-<pid>.jsonl``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from api_worker import event_log, run_checks_or_abort, write_results  # beside this script
from markers import await_markers

import elasticjob.worker_runtime as hvd

Json = dict[str, Any]
MARKERS_WITHIN_S = 60.0


def error_of(call: Any) -> str | None:
    """The exception ``call()`` raised, as ``Type: message`` (None if it returned)."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def async_checks(r: int, n: int) -> Json:
    x = torch.tensor([r + 1.0, 2.0 * r])
    y = torch.tensor([[r * 1.0, 3.0], [1.0, -r * 1.0]])
    z = torch.tensor([r, r, r])
    h_sum = hvd.allreduce_async(x, op=hvd.Sum)
    h_avg = hvd.allreduce_async_(y)
    h_cast = hvd.broadcast_async(torch.tensor([r * 10.0, 1.0]), root_rank=n - 1)
    h_cast_ = hvd.broadcast_async_(z, root_rank=0)
    h_gather = hvd.allgather_async(torch.full((r + 1, 2), float(r)))
    handles = [h_sum, h_avg, h_cast, h_cast_, h_gather]
    polled = [hvd.poll(h) for h in handles]
    # Synchronized in another order than issued.
    gathered = hvd.synchronize(h_gather)
    cast_ = hvd.synchronize(h_cast_)
    cast = hvd.synchronize(h_cast)
    avg = hvd.synchronize(h_avg)
    total = hvd.synchronize(h_sum)
    return {
        "handles_are_ints": all(isinstance(h, int) for h in handles),
        "poll_types": [type(p).__name__ for p in polled],
        "sum": total.tolist(),
        "input_unchanged": x.tolist() == [r + 1.0, 2.0 * r],
        "avg_inplace": avg.tolist(),
        "avg_is_input": avg is y,
        "broadcast": cast.tolist(),
        "broadcast_inplace": cast_.tolist(),
        "broadcast_inplace_is_input": cast_ is z,
        "allgather": gathered.tolist(),
        "synchronize_again": hvd.synchronize(h_sum),
        "poll_after": error_of(lambda: hvd.poll(h_sum)),
    }


def grouped_checks(r: int) -> Json:
    def tensors() -> list[torch.Tensor]:
        return [
            torch.tensor([r + 1.0, -1.0]),
            torch.tensor([[r * 0.5], [2.0]], dtype=torch.float64),
            torch.tensor([r, 10 * r + 1]),
        ]

    summed = hvd.grouped_allreduce(tensors(), op=hvd.Sum)
    inplace = tensors()
    averaged = hvd.grouped_allreduce_(inplace)
    handle = hvd.grouped_allreduce_async(tensors(), average=False, postscale_factor=2.0)
    scaled = hvd.synchronize(handle)
    fp16 = hvd.grouped_allreduce(tensors(), op=hvd.Sum, compression=hvd.Compression.fp16)
    return {
        "fp16": [t.tolist() for t in fp16],
        "fp16_dtypes": [str(t.dtype) for t in fp16],
        "fp16_plain": hvd.allreduce(
            torch.tensor([r + 0.5]), op=hvd.Sum, compression=hvd.Compression.fp16
        ).tolist(),
        "sum": [t.tolist() for t in summed],
        "dtypes": [str(t.dtype) for t in summed],
        "average": [t.tolist() for t in averaged],
        "average_is_input": all(a is b for a, b in zip(averaged, inplace, strict=True)),
        "async_sum_post2": [t.tolist() for t in scaled],
    }


def alltoall_checks(r: int, n: int) -> Json:
    splits = [(r + j + 1) % 3 for j in range(n)]
    rows = sum(splits)
    tensor = torch.tensor([[100.0 * r + k, -1.0] for k in range(rows)]).reshape(rows, 2)
    received, received_splits = hvd.alltoall(tensor, splits=torch.tensor(splits))
    even = torch.arange(2 * n, dtype=torch.int64) + 10 * r
    handle = hvd.alltoall_async(even)
    even_received, even_splits = hvd.synchronize(handle)
    return {
        "received": received.tolist(),
        "received_splits": received_splits.tolist(),
        "received_splits_dtype": str(received_splits.dtype),
        "even": hvd.alltoall(even).tolist(),
        "even_async": even_received.tolist(),
        "even_async_splits": even_splits.tolist(),
        "bad_splits": error_of(lambda: hvd.alltoall(tensor, splits=[rows + 1] + [0] * (n - 1))),
    }


def reducescatter_checks(r: int, n: int) -> Json:
    rows = 2 * n + 1
    tensor = torch.tensor([[(r + 1.0) * (k + 1), float(k)] for k in range(rows)])
    average = hvd.reducescatter(tensor)
    total = hvd.synchronize(hvd.reducescatter_async(tensor, op=hvd.Sum))
    fp16 = hvd.reducescatter(tensor, op=hvd.Sum, compression=hvd.Compression.fp16)
    return {
        "average": average.tolist(),
        "sum": total.tolist(),
        "fp16": fp16.tolist(),
        "fp16_dtype": str(fp16.dtype),
    }


def grouped_gather_scatter_checks(r: int, n: int) -> Json:
    rows = 2 * n + 1
    gathered = hvd.grouped_allgather(
        [torch.full((r + 1, 2), float(r)), torch.tensor([10 * r], dtype=torch.int64)]
    )
    gathered_async = hvd.synchronize(hvd.grouped_allgather_async([torch.tensor([r, -r])]))
    tensors = [torch.tensor([[(r + 1.0) * (k + 1)] for k in range(rows)]), torch.ones(n, 3)]
    summed = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
    averaged = hvd.synchronize(hvd.grouped_reducescatter_async(tensors))
    sparse = torch.sparse_coo_tensor([[r % 2, 3]], [1.0, r + 1.0], (4,))
    sparse_avg = hvd.sparse_allreduce_async(sparse, name="sparse", op=hvd.Average)()
    sparse_sum = hvd.sparse_allreduce_async(sparse, name="sparse", op=hvd.Sum)()
    return {
        "gathered": [t.tolist() for t in gathered],
        "gathered_dtypes": [str(t.dtype) for t in gathered],
        "gathered_async": [t.tolist() for t in gathered_async],
        "scatter_sum": [t.tolist() for t in summed],
        "scatter_average": [t.tolist() for t in averaged],
        "sparse_average": sparse_avg.to_dense().tolist(),
        "sparse_sum": sparse_sum.to_dense().tolist(),
        "sparse_is_sparse": sparse_sum.is_sparse,
        "sparse_dense_input": error_of(
            lambda: hvd.sparse_allreduce_async(torch.ones(2), "d", None)
        ),
    }


def coordination_checks(r: int, n: int) -> Json:
    started = time.monotonic()
    if r == 0:
        time.sleep(0.5)
    hvd.barrier()
    waited = time.monotonic() - started
    # Rank n-1 joins last, then rank 0: join returns the last to arrive.
    if r == n - 1:
        time.sleep(0.5)
    first = hvd.join()
    if r == 0:
        time.sleep(0.5)
    second = hvd.join()
    return {"barrier_waited_s": waited, "join": [first, second]}


def join_checks(r: int) -> Json:
    """Horovod's join: rank 0 joins at once, the others average a tensor (rank 0 adds zeros
    and counts in the divisor), try an allgather (refused while a rank has joined), then
    join; every join returns the rank that joined last."""
    if r == 0:
        return {"last": hvd.join()}
    averaged = hvd.allreduce(torch.full((3,), float(r + 1)), name="after_join")
    try:
        hvd.allgather(torch.ones(2))
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    return {"averaged": averaged.tolist(), "refused": refused, "last": hvd.join()}


def sync_batch_norm_checks(r: int, n: int) -> Json:
    generator = torch.Generator().manual_seed(7 + r)
    x = torch.randn(r + 2, 3, 4, generator=generator, dtype=torch.float64) * (r + 1) + r
    x.requires_grad_(True)
    weight = torch.randn(r + 2, 3, 4, generator=generator, dtype=torch.float64)
    bn = hvd.SyncBatchNorm(3, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
        bn.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
    out = bn(x)
    (out * weight).sum().backward()
    assert x.grad is not None and bn.weight.grad is not None and bn.bias.grad is not None
    # Reference: a plain BatchNorm on every rank's batch, with the sum of every rank's loss.
    ref_x = hvd.allgather(x.detach()).requires_grad_(True)
    ref_weight = hvd.allgather(weight)
    ref = torch.nn.BatchNorm1d(3, momentum=0.3).double()
    with torch.no_grad():
        ref.weight.copy_(bn.weight)
        ref.bias.copy_(bn.bias)
    ref_out = ref(ref_x)
    (ref_out * ref_weight).sum().backward()
    assert ref_x.grad is not None and ref.weight.grad is not None and ref.bias.grad is not None
    start = sum(q + 2 for q in range(r))
    mine = slice(start, start + x.shape[0])
    weight_grad = hvd.allreduce(bn.weight.grad, op=hvd.Sum)
    bias_grad = hvd.allreduce(bn.bias.grad, op=hvd.Sum)
    assert bn.running_mean is not None and bn.running_var is not None
    assert ref.running_mean is not None and ref.running_var is not None
    assert bn.num_batches_tracked is not None
    bn.eval()
    ref.eval()
    probe = torch.ones(2, 3, 4, dtype=torch.float64)
    return {
        "output": float((out - ref_out[mine]).detach().abs().max()),
        "input_grad": float((x.grad - ref_x.grad[mine]).abs().max()),
        "weight_grad": float((weight_grad - ref.weight.grad).abs().max()),
        "bias_grad": float((bias_grad - ref.bias.grad).abs().max()),
        "running_mean": float((bn.running_mean - ref.running_mean).abs().max()),
        "running_var": float((bn.running_var - ref.running_var).abs().max()),
        "eval_output": float((bn(probe) - ref(probe)).abs().max()),
        "batches_tracked": int(bn.num_batches_tracked),
    }


def process_set_checks(n: int) -> Json:
    whole = hvd.ProcessSet(list(range(n)))
    return {
        "global_ranks": hvd.global_process_set.ranks,
        "global_size": hvd.global_process_set.size(),
        "global_rank": hvd.global_process_set.rank(),
        "global_id": hvd.global_process_set.process_set_id,
        "included": hvd.global_process_set.included(),
        "unregistered_id": whole.process_set_id,
        "unregistered": error_of(lambda: hvd.allreduce(torch.ones(1), process_set=whole)),
        "add_whole": error_of(lambda: hvd.add_process_set(whole)),
        "add_outside": error_of(lambda: hvd.add_process_set([n])),
        "remove_global": hvd.remove_process_set(hvd.global_process_set),
    }


def capability_checks() -> Json:
    return {
        "mpi_built": hvd.mpi_built(),
        "mpi_enabled": hvd.mpi_enabled(),
        "mpi_threads_supported": hvd.mpi_threads_supported(),
        "gloo_built": hvd.gloo_built(),
        "gloo_enabled": hvd.gloo_enabled(),
        "nccl_built": hvd.nccl_built(),
        "cuda_built": hvd.cuda_built(),
        "other_builds": [hvd.rocm_built(), hvd.ddl_built(), hvd.ccl_built()],
        "adasum": error_of(lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum)),
        "adasum_async": error_of(lambda: hvd.allreduce_async(torch.ones(2), op=hvd.Adasum)),
    }


def timeline_checks(out: Path) -> Json:
    path = out / "timeline.json"
    hvd.start_timeline(str(path))
    hvd.allreduce(torch.ones(3))
    hvd.synchronize(hvd.allreduce_async(torch.ones(3)))
    hvd.barrier()
    hvd.stop_timeline()
    return {"path": str(path), "pid": os.getpid()}


def run(out: Path) -> Json:
    """This rank's results, from init to shutdown; its timeline goes to ``out``."""
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out.mkdir(parents=True, exist_ok=True)
    results: Json = {
        "rank": r,
        "size": n,
        "async": async_checks(r, n),
        "grouped": grouped_checks(r),
        "alltoall": alltoall_checks(r, n),
        "reducescatter": reducescatter_checks(r, n),
        "grouped_gather_scatter": grouped_gather_scatter_checks(r, n),
        "coordination": coordination_checks(r, n),
        "join": join_checks(r),
        "sync_batch_norm": sync_batch_norm_checks(r, n),
        "process_set": process_set_checks(n),
        "capabilities": capability_checks(),
        "timeline": timeline_checks(out),
    }
    hvd.shutdown()
    return results


def values_run(out: Path) -> None:
    results = run(out)
    write_results(out, results["rank"], results)


def abort_run(out: Path) -> None:
    event = event_log(out)

    hvd.init()
    state = hvd.elastic.ObjectState(recovered=0)

    @hvd.elastic.run
    def train(state: Any) -> float:
        r = hvd.rank()
        if hvd.size() == 3:
            hvd.synchronize(hvd.allreduce_async(torch.ones(4)))  # everyone is in the round
            if r == 2:
                # The kill must come while its peers wait, or a peer could learn of it
                # before it reaches its collective.
                peers = [out / "waiting-0", out / "waiting-1"]
                if not await_markers(peers, MARKERS_WITHIN_S):
                    raise TimeoutError(f"no {peers} within {MARKERS_WITHIN_S} s")
                event("kill")
                os.kill(os.getpid(), signal.SIGKILL)
            handle = hvd.allreduce_async(torch.ones(1000))  # rank 2 never joins it
            (out / f"waiting-{r}").touch()  # past every call that may not raise yet
            try:
                if r == 0:
                    hvd.barrier()
                else:
                    hvd.synchronize(handle)
            except hvd.HorovodInternalError as exc:
                event("raised", waiting_in="barrier" if r == 0 else "synchronize", error=str(exc))
                raise
            event("not_raised")
            return -1.0
        total = hvd.synchronize(hvd.allreduce_async(torch.tensor([r + 1.0]), op=hvd.Sum))
        hvd.barrier()
        last = hvd.join()
        event("recovered", total=total.item(), last_joined=last)
        return float(total.item())

    train(state)
    hvd.shutdown()


if __name__ == "__main__":
    run_checks_or_abort(values_run, abort_run)
