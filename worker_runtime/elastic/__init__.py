"""Elastic training API (Horovod's ``hvd.elastic``).

``ShardedState``, ``ShardsLostError`` and ``LayoutError`` are imported on first use: they need
``torch.distributed.checkpoint``, whose import a script that does not shard should not pay
for (nor its effects: a worker dismissed from a job then ends with SIGABRT).
"""

import importlib
from typing import TYPE_CHECKING

from elasticjob.worker_runtime.elastic.batch_plan import MicroBatch
from elasticjob.worker_runtime.elastic.checkpoint_files import CheckpointError
from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.global_batch import GlobalBatchSampler, accumulate
from elasticjob.worker_runtime.elastic.run import run
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.elastic.state import ObjectState, SnapshotState, State, TorchState
from elasticjob.worker_runtime.elastic.state_handlers import (
    DistributedDataParallelStateHandler,
    ModelStateHandler,
    ObjectStateHandler,
    OptimizerStateHandler,
    SamplerStateHandler,
    StatefulHandler,
    StateHandler,
)

if TYPE_CHECKING:
    from elasticjob.worker_runtime.elastic.sharded.sharded_state import (
        LayoutError,
        ShardedState,
        ShardsLostError,
    )

__all__ = [
    "CheckpointError",
    "DistributedDataParallel",
    "DistributedDataParallelStateHandler",
    "ElasticSampler",
    "GlobalBatchSampler",
    "LayoutError",
    "MicroBatch",
    "ModelStateHandler",
    "ObjectState",
    "ObjectStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "ShardedState",
    "ShardsLostError",
    "SnapshotState",
    "State",
    "StateHandler",
    "StatefulHandler",
    "TorchState",
    "accumulate",
    "run",
]


_SHARDED = frozenset({"LayoutError", "ShardedState", "ShardsLostError"})


def __getattr__(name: str) -> object:
    if name in _SHARDED:
        sharded_state = importlib.import_module(
            "elasticjob.worker_runtime.elastic.sharded.sharded_state"
        )
        return getattr(sharded_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
