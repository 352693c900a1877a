"""Elastic training API (Horovod's ``hvd.elastic``)."""

from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.run import run
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.elastic.state import (
    DistributedDataParallelStateHandler,
    ModelStateHandler,
    ObjectState,
    ObjectStateHandler,
    OptimizerStateHandler,
    SamplerStateHandler,
    State,
    StateHandler,
    TorchState,
)

__all__ = [
    "DistributedDataParallel",
    "DistributedDataParallelStateHandler",
    "ElasticSampler",
    "ModelStateHandler",
    "ObjectState",
    "ObjectStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "State",
    "StateHandler",
    "TorchState",
    "run",
]
