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
from elasticjob.worker_runtime.basics import (
    cross_rank,
    cross_size,
    current_round,
    device,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    report_progress,
    shutdown,
    size,
)
from elasticjob.worker_runtime.collectives import (
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_state,
)
from elasticjob.worker_runtime.exceptions import (
    CollectiveError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    WorkerRemoved,
)
from elasticjob.worker_runtime.optimizer import Compression, DistributedOptimizer

__all__ = [
    "Average",
    "CollectiveError",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "WorkerRemoved",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "broadcast_state",
    "cross_rank",
    "cross_size",
    "current_round",
    "device",
    "elastic",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "report_progress",
    "shutdown",
    "size",
]
