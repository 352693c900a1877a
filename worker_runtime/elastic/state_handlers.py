"""How a :class:`~elasticjob.worker_runtime.elastic.TorchState` (and the other attributes of a
``ShardedState``) commits, restores and syncs each kind of attribute
(``TorchState.register_handler`` adds kinds), and the attributes kept that way
(:class:`HandledAttributes`)."""

from __future__ import annotations

import abc
import copy
import pickle
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from elasticjob.worker_runtime.collectives.round_syncs import (
    broadcast_object,
    broadcast_parameters,
    sync_optimizer_state,
)
from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.global_batch import GlobalBatchSampler
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.training.optimizer import DistributedMixin


class StateHandler(abc.ABC):
    """Commits, restores and syncs one attribute of a :class:`TorchState`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @abc.abstractmethod
    def state_dict(self) -> Any:
        """What a commit snapshots: dicts, lists and tuples of tensors (copied into the
        snapshot's buffers, so return live tensors) and picklable values (deep-copied)."""

    @abc.abstractmethod
    def load_state_dict(self, saved: Any) -> None:
        """Set the value from what :meth:`state_dict` returned at a commit (tensors belong
        to the snapshot: copy what is kept)."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Replace the value with rank 0's."""

    def on_reset(self) -> None:  # noqa: B027 (optional hook)
        """Called after every reset, before the user's reset callbacks."""

    def check(self, name: str) -> None:  # noqa: B027 (optional check)
        """Raise :class:`TypeError`, naming the attribute ``name``, when the value cannot be
        committed or synced (called when the state is made, not at a later sync)."""


class ModelStateHandler(StateHandler):
    value: torch.nn.Module

    @property
    def module(self) -> torch.nn.Module:
        """The module whose weights are saved."""
        return self.value

    def state_dict(self) -> Any:
        return self.module.state_dict()

    def load_state_dict(self, saved: Any) -> None:
        self.module.load_state_dict(saved)  # copies into the module's tensors
        # A rollback drops the gradients of the step it undoes (accumulated micro-batches, a
        # backward pass a failure cut short): the step is trained again from none.
        for param in self.module.parameters():
            param.grad = None

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

    def state_dict(self) -> Any:
        return self.value.state_dict()

    def load_state_dict(self, saved: Any) -> None:
        optimizer = self.value
        if loads_plainly(optimizer) and copy_optimizer_state(optimizer, saved):
            if isinstance(optimizer, DistributedMixin):
                optimizer.forget_reduction()  # what its load_state_dict would have done
            return
        # The optimizer keeps the tensors it is given: give it copies.
        optimizer.load_state_dict(copy.deepcopy(saved))

    def sync(self) -> None:
        sync_optimizer_state(self.value, root_rank=0)


def loads_plainly(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.load_state_dict`` is torch's own (under the DistributedOptimizer's,
    which only forgets its reduction first) with no load hooks: only then may a rollback copy
    the state in place instead of calling it."""
    for cls in type(optimizer).__mro__:
        if cls is torch.optim.Optimizer:
            break
        if "load_state_dict" in vars(cls) and cls is not DistributedMixin:
            return False
    hooks = ("_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
    return not any(getattr(optimizer, name, None) for name in hooks)


def copy_optimizer_state(optimizer: torch.optim.Optimizer, saved: Any) -> bool:
    """Copy ``saved`` (an earlier ``state_dict()`` of ``optimizer``) into the optimizer's own
    tensors and groups, as a rollback does: no tensor is allocated and nothing a scheduler or
    the script holds is replaced. Returns False, changing nothing, when the state's structure
    changed since (a parameter gained or lost state, a tensor its shape, dtype or device):
    the caller then loads it whole."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    state = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not isinstance(state, dict):
        return False
    if [len(g.get("params", ())) for g in groups] != [
        len(g["params"]) for g in optimizer.param_groups
    ]:
        return False
    # torch's rule: the saved groups' ids name the current groups' parameters, in order.
    params = dict(
        zip(
            (i for g in groups for i in g["params"]),
            (p for g in optimizer.param_groups for p in g["params"]),
            strict=True,
        )
    )
    if set(state) != {i for i, p in params.items() if p in optimizer.state}:
        return False
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for index, entries in state.items():
        live = optimizer.state[params[index]]
        if not isinstance(entries, dict) or set(entries) != set(live):
            return False
        for name, value in entries.items():
            current = live[name]
            if isinstance(value, torch.Tensor) != isinstance(current, torch.Tensor):
                return False
            if isinstance(value, torch.Tensor):
                if (value.shape, value.dtype, value.device) != (
                    current.shape,
                    current.dtype,
                    current.device,
                ):
                    return False
                pairs.append((current, value))
    with torch.no_grad():
        for current, value in pairs:
            current.copy_(value)
    for index, entries in state.items():
        live = optimizer.state[params[index]]
        for name, value in entries.items():
            if not isinstance(value, torch.Tensor):
                live[name] = copy.deepcopy(value)
    for group, saved_group in zip(optimizer.param_groups, groups, strict=True):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = copy.deepcopy(value)
    return True


class StatefulHandler(StateHandler):
    """An object with ``state_dict()`` and ``load_state_dict()`` (a learning-rate scheduler,
    a ``torch.amp.GradScaler``, a script's own), kept through its state dict: restored and
    synced in place, so the object stays the script's and stays bound to what it refers to
    (a scheduler to the state's live optimizer, not to a copy of it)."""

    def state_dict(self) -> Any:
        return self.value.state_dict()

    def load_state_dict(self, saved: Any) -> None:
        self.value.load_state_dict(copy.deepcopy(saved))

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))

    def check(self, name: str) -> None:
        _check_picklable(name, self.value.state_dict(), f"its state_dict() ({type(self.value)})")


class SamplerStateHandler(StatefulHandler):
    """An ``ElasticSampler`` or a ``GlobalBatchSampler``: its progress, and a new split of
    what is left of the epoch after every reset."""

    value: ElasticSampler | GlobalBatchSampler

    def on_reset(self) -> None:
        # Repartition what is left of the epoch over the new world, also when no sync follows
        # (a graceful removal): no sample is repeated or lost.
        self.value.reset()


def has_state_dict(value: Any) -> bool:
    """Whether ``value`` offers ``state_dict()`` and ``load_state_dict()`` (an object, not a
    class)."""
    return not isinstance(value, type) and all(
        callable(getattr(value, method, None)) for method in ("state_dict", "load_state_dict")
    )


class ObjectStateHandler(StateHandler):
    """Any other value (numbers, strings, containers, picklable objects): deep-copied at a
    commit, replaced by the copy at a rollback, pickled from rank 0 at a sync."""

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, saved: Any) -> None:
        self.value = copy.deepcopy(saved)

    def sync(self) -> None:
        self.value = broadcast_object(self.value, root_rank=0)

    def check(self, name: str) -> None:
        _check_picklable(name, self.value, f"the value ({type(self.value)})")


def _check_picklable(name: str, value: Any, what: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:  # pickle raises many kinds (PicklingError, TypeError...)
        raise TypeError(
            f"state attribute {name!r} cannot be committed and synced: {what} cannot be "
            f"pickled ({exc}). Keep what it holds in picklable values or tensors, give it "
            "state_dict() and load_state_dict(), or register a handler for its type "
            "(register_handler)"
        ) from exc


class HandledAttributes:
    """A state's attributes given as keyword arguments, each kept by the
    :class:`StateHandler` of its type (the registry's first match, else a stateful object's
    where it has ``state_dict()`` and ``load_state_dict()``, else an object's):
    ``state.name`` reads and writes the handler's value."""

    handler_registry: ClassVar[list[tuple[type, type[StateHandler]]]] = [
        (torch.nn.Module, ModelStateHandler),
        (DistributedDataParallel, DistributedDataParallelStateHandler),
        (torch.optim.Optimizer, OptimizerStateHandler),
        (ElasticSampler, SamplerStateHandler),
        (GlobalBatchSampler, SamplerStateHandler),
    ]
    _handlers: dict[str, StateHandler]

    @classmethod
    def register_handler(cls, kind: type, handler: type[StateHandler]) -> None:
        """Use ``handler`` for attributes that are instances of ``kind`` (checked before the
        built-in handlers)."""
        cls.handler_registry.insert(0, (kind, handler))

    @classmethod
    def handler_for(cls, value: Any) -> StateHandler:
        """The handler of the registry's first type ``value`` is (else an object's)."""
        for kind, handler in cls.handler_registry:
            if isinstance(value, kind):
                return handler(value)
        if has_state_dict(value):
            return StatefulHandler(value)
        return ObjectStateHandler(value)

    def _keep_attributes(self, values: Mapping[str, Any]) -> list[Callable[[], None]]:
        """Keep ``values`` as attributes; return their handlers' reset hooks (the state's
        first reset callbacks)."""
        handlers = {name: self.handler_for(v) for name, v in values.items()}
        for name, handler in handlers.items():
            handler.check(name)
        self.__dict__["_handlers"] = handlers
        return [handler.on_reset for handler in handlers.values()]

    def _attribute_states(self) -> dict[str, Any]:
        """Each attribute's ``state_dict()``, by name (tensors live)."""
        return {name: handler.state_dict() for name, handler in self._handlers.items()}

    def _load_attributes(self, saved: Mapping[str, Any]) -> None:
        """Set the attributes ``saved`` holds from their saved state."""
        for name, handler in self._handlers.items():
            if name in saved:
                handler.load_state_dict(saved[name])

    def _sync_attributes(self) -> None:
        """Replace every attribute with rank 0's."""
        for handler in self._handlers.values():
            handler.sync()

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
