"""The elasticjob worker runtime: the library a training script imports.

Its public names mirror ``horovod.torch`` and ``horovod.torch.elastic``, so a Horovod elastic
PyTorch script runs after changing only its import line::

    import elasticjob.worker_runtime as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)

    @hvd.elastic.run
    def train(state): ...
"""

from elasticjob.worker_runtime import elastic
from elasticjob.worker_runtime.async_collectives import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from elasticjob.worker_runtime.autograd_collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from elasticjob.worker_runtime.basics import (
    cross_rank,
    cross_size,
    current_round,
    device,
    is_initialized,
    local_rank,
    local_size,
    rank,
    report_progress,
    shutdown,
    size,
)
from elasticjob.worker_runtime.capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from elasticjob.worker_runtime.collectives import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_state,
)
from elasticjob.worker_runtime.coordination import barrier, join
from elasticjob.worker_runtime.exceptions import (
    CollectiveError,
    CollectiveMismatchError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    WorkerRemoved,
)
from elasticjob.worker_runtime.grouped_collectives import (
    grouped_allgather_async,
    grouped_reducescatter_async,
    sparse_allreduce_async,
)
from elasticjob.worker_runtime.handles import poll, synchronize
from elasticjob.worker_runtime.object_collectives import allgather_object, broadcast_object
from elasticjob.worker_runtime.optimizer import Compression, DistributedOptimizer
from elasticjob.worker_runtime.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    init,
    remove_process_set,
)
from elasticjob.worker_runtime.scatter_collectives import alltoall_async, reducescatter_async
from elasticjob.worker_runtime.sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum",
    "Average",
    "CollectiveError",
    "CollectiveMismatchError",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNorm",
    "WorkerRemoved",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "broadcast_state",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "current_round",
    "ddl_built",
    "device",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "report_progress",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
