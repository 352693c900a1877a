"""Elastic state: committed in memory, rolled back on failure, synced from rank 0.

``commit()`` snapshots the state in memory and checks for host updates; ``restore()`` rolls
back to the last snapshot (after a collective failure); ``sync()`` gives every rank rank 0's
live state (after a new group formed with newcomers or after a rollback; rank 0 is always a
member of the previous round, so it holds the freshest state).

:class:`TorchState` dispatches each attribute to a :class:`StateHandler` chosen by type from
an extensible registry (models, optimizers, elastic samplers; anything else is deep-copied
and pickled).
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from elasticjob.worker_runtime import timeline
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler


class State(abc.ABC):
    """Base of elastic state objects (Horovod's ``hvd.elastic.State``)."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called after every reset, once the new group exists and before state is
        synced: adjust the learning rate to the new world size, repartition data, rebuild a
        DistributedDataParallel wrapper."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``elastic.run`` after each reset."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Snapshot the state in memory, then check for host updates (which may raise
        :class:`~elasticjob.worker_runtime.HostsUpdatedInterrupt` on every rank at once)."""
        started, started_us = time.monotonic(), timeline.now()
        self.save()
        timeline.span("commit", started_us)
        current().report_commit(time.monotonic() - started)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if any rank saw hosts change."""
        current().check_host_updates()

    @abc.abstractmethod
    def save(self) -> None:
        """Snapshot the live state in memory."""

    @abc.abstractmethod
    def restore(self) -> None:
        """Roll the live state back to the last snapshot."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Replace every rank's live state with rank 0's, then snapshot it."""


class ObjectState(State):
    """State made of picklable attributes given as keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self.save()

    def save(self) -> None:
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self) -> None:
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        live = {name: getattr(self, name) for name in self._names}
        for name, value in broadcast_object(live, root_rank=0).items():
            setattr(self, name, value)
        self.save()


class StateHandler(abc.ABC):
    """Saves, restores and syncs one attribute of a :class:`TorchState`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @abc.abstractmethod
    def save(self) -> None: ...

    @abc.abstractmethod
    def restore(self) -> None: ...

    @abc.abstractmethod
    def sync(self) -> None: ...

    def on_reset(self) -> None:  # noqa: B027 (optional hook)
        """Called after every reset, before the user's reset callbacks."""


class ModelStateHandler(StateHandler):
    value: torch.nn.Module

    @property
    def module(self) -> torch.nn.Module:
        """The module whose weights are saved."""
        return self.value

    def save(self) -> None:
        self._saved = {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def restore(self) -> None:
        self.module.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_parameters(self.module.state_dict(), root_rank=0)


class DistributedDataParallelStateHandler(ModelStateHandler):
    """The elastic ``DistributedDataParallel``: its module's weights, without building a
    DDP (the round may be broken when state is restored)."""

    value: DistributedDataParallel  # type: ignore[assignment]

    @property
    def module(self) -> torch.nn.Module:
        return self.value.module


class OptimizerStateHandler(StateHandler):
    value: torch.optim.Optimizer

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    value: ElasticSampler

    def save(self) -> None:
        self._saved = self.value.state_dict()

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))

    def on_reset(self) -> None:
        # Repartition what is left of the epoch over the new world, also when no sync follows
        # (a graceful removal): no sample is repeated or lost.
        self.value.reset()


class ObjectStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value)

    def restore(self) -> None:
        self.value = copy.deepcopy(self._saved)

    def sync(self) -> None:
        self.value = broadcast_object(self.value, root_rank=0)


class TorchState(State):
    """State of a PyTorch training loop (Horovod's ``hvd.elastic.TorchState``): a model, an
    optimizer and any other attributes (samplers, epoch and batch counters...)."""

    handler_registry: ClassVar[list[tuple[type, type[StateHandler]]]] = [
        (torch.nn.Module, ModelStateHandler),
        (DistributedDataParallel, DistributedDataParallelStateHandler),
        (torch.optim.Optimizer, OptimizerStateHandler),
        (ElasticSampler, SamplerStateHandler),
    ]

    @classmethod
    def register_handler(cls, kind: type, handler: type[StateHandler]) -> None:
        """Use ``handler`` for attributes that are instances of ``kind`` (checked before the
        built-in handlers)."""
        cls.handler_registry.insert(0, (kind, handler))

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        self._handlers: dict[str, StateHandler] = {
            name: self._handler_for(value) for name, value in values.items()
        }
        self.save()

    def _handler_for(self, value: Any) -> StateHandler:
        for kind, handler in self.handler_registry:
            if isinstance(value, kind):
                return handler(value)
        return ObjectStateHandler(value)

    def __getattr__(self, name: str) -> Any:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            return handlers[name].value
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].value = value
        else:
            super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        self.save()

    def on_reset(self) -> None:
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()
