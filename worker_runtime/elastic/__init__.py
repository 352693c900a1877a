"""Elastic training API (Horovod's ``hvd.elastic``)."""

from elasticjob.worker_runtime.elastic.checkpoint_files import CheckpointError
from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.handlers import (
    DistributedDataParallelStateHandler,
    ModelStateHandler,
    ObjectStateHandler,
    OptimizerStateHandler,
    SamplerStateHandler,
    StateHandler,
)
from elasticjob.worker_runtime.elastic.run import run
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.elastic.state import ObjectState, SnapshotState, State, TorchState

__all__ = [
    "CheckpointError",
    "DistributedDataParallel",
    "DistributedDataParallelStateHandler",
    "ElasticSampler",
    "ModelStateHandler",
    "ObjectState",
    "ObjectStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "SnapshotState",
    "State",
    "StateHandler",
    "TorchState",
    "run",
]
