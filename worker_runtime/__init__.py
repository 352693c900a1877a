"""The elasticjob worker runtime: the library a training script imports.

Its public names mirror ``horovod.torch`` and ``horovod.torch.elastic``, so a Horovod elastic
PyTorch script runs after changing only its import line::

    import elasticjob.worker_runtime as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)

    @hvd.elastic.run
    def train(state): ...

Every name is imported on first use (PEP 562, from ``horovod_api.py``): importing the package,
or running one of its supervisors (``python -m elasticjob.worker_runtime.agents.slot_supervisor``),
imports no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elasticjob.worker_runtime.horovod_api import *  # noqa: F403

_API = "elasticjob.worker_runtime.horovod_api"


def _api() -> ModuleType:
    return importlib.import_module(_API)


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = _api()
    if name not in api.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_api().__all__})
