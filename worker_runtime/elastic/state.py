"""Elastic state: committed in memory, rolled back on failure, synced from rank 0.

``commit()`` snapshots the state in memory and checks for host updates; ``restore()`` rolls
back to the last snapshot (after a collective failure); ``sync()`` gives every rank rank 0's
live state (after a new group formed with newcomers or after a rollback; rank 0 is always a
member of the previous round, so it holds the freshest state, unless no member survived:
then it is a fresh process that loaded the newest durable checkpoint, see ``checkpoint.py``).

:class:`ObjectState` and :class:`TorchState` keep their commits in preallocated snapshot
buffers (``snapshot.py``). :class:`TorchState` dispatches each attribute to a
:class:`StateHandler` chosen by type from an extensible registry (models, optimizers,
elastic samplers; anything else is deep-copied and pickled).
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from elasticjob.wire.messages import CheckpointReport
from elasticjob.worker_contract import checkpoint_from_env
from elasticjob.worker_runtime.basics import current, is_initialized
from elasticjob.worker_runtime.collectives.round_syncs import broadcast_object
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.checkpoint import Checkpointer, load_newest
from elasticjob.worker_runtime.elastic.checkpoint_files import CheckpointError, Manifest
from elasticjob.worker_runtime.elastic.ddp import DistributedDataParallel
from elasticjob.worker_runtime.elastic.host_messages import HostMessages
from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.elastic.snapshot import SnapshotKeeper, find_tensors
from elasticjob.worker_runtime.elastic.state_handlers import (
    DistributedDataParallelStateHandler,
    ModelStateHandler,
    ObjectStateHandler,
    OptimizerStateHandler,
    SamplerStateHandler,
    StateHandler,
)

logger = get_logger(__name__)


class State(abc.ABC):
    """Base of elastic state objects (Horovod's ``hvd.elastic.State``)."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._last_updated_timestamp = 0
        """Horovod's attribute of the same name, which scripts may reset; nothing reads it
        here (notices are ordered by sequence number, not by timestamp)."""

    @property
    def _host_messages(self) -> HostMessages:
        """Horovod's queue of host-update notifications, as a read-only view: scripts poll
        ``state._host_messages.empty()`` to wait until a host change reached this worker."""
        return HostMessages()

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
        """Snapshot the state in memory (and on rank 0 write a durable checkpoint when the
        job's policy says so), then check for host updates (which may raise
        :class:`~elasticjob.worker_runtime.HostsUpdatedInterrupt` on every rank at once)."""
        started, started_us = time.monotonic(), timeline.now()
        self.save()
        timeline.span("commit", started_us)
        current().reports.commit(time.monotonic() - started)
        self.after_commit()
        self.check_host_updates()

    def after_commit(self) -> None:  # noqa: B027 (optional hook)
        """Called after each commit's snapshot (durable checkpoints start here)."""

    def resume_from_checkpoint(self) -> CheckpointReport | None:
        """Called by ``elastic.run`` on rank 0 before the first sync: a state that never held
        the job's committed state loads the newest durable checkpoint (None: nothing loaded)."""
        return None

    def finish_checkpoints(self) -> None:  # noqa: B027 (optional hook)
        """Called when the training function returns: wait for a checkpoint being written."""

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this state writes durable checkpoints (the job has a checkpoint folder)."""
        return False

    def checkpoint(self) -> None:
        """Write the last commit as a durable checkpoint now. Raises :class:`RuntimeError`
        when the state writes none (see :attr:`writes_checkpoints`)."""
        raise RuntimeError("no checkpoint folder configured (ELASTICJOB_CHECKPOINT_DIR)")

    def checkpoint_for_suspension(self) -> bool:
        """Called by ``elastic.run`` on every rank when the job is being suspended: write the
        last commit as a durable checkpoint and wait until it is written (nothing when the
        state writes none: the job then starts afresh when it resumes). Returns whether this
        rank did its part (False: its write failed)."""
        if self.writes_checkpoints:
            self.checkpoint()
            self.finish_checkpoints()
        return True

    def loaded_checkpoint(self) -> CheckpointReport | None:
        """The durable checkpoint the last sync loaded, once, on the rank that reports it (a
        state whose ranks load a checkpoint together, in the sync, rather than rank 0 alone
        before it)."""
        return None

    def commit_token(self) -> tuple[int, int] | None:
        """An identity of the last commit, equal on two ranks only if their commits hold the
        same state (None: unknown; ``elastic.run`` then syncs). After every rank rolled back
        to commits with equal tokens, the next round skips the sync: nothing would change."""
        return None

    def wants_sync(self, required: bool) -> bool:
        """Whether a new round syncs this state; ``required``: the driver says it must
        (newcomers, or a rollback). A state laid out over the world reshards every round."""
        return required

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


class SnapshotState(State):
    """A state whose commits are snapshots of :meth:`state_dict` in preallocated buffers,
    and which writes and loads durable checkpoints under the job's checkpoint policy
    (``ELASTICJOB_CHECKPOINT_*``)."""

    def __init__(self, *, background_commit: bool = False) -> None:
        super().__init__()
        self._keeper = SnapshotKeeper(background=background_commit)
        policy = checkpoint_from_env()
        self._checkpointer = (
            # current() when a checkpoint completes: init() after shutdown() makes a new one
            Checkpointer(policy, self._keeper, lambda r: current().reports.checkpoint(r))  # noqa: PLW0108
            if policy is not None
            else None
        )
        self._holds_job_state = False
        """Whether this process's state was synced or committed in a round of the job."""
        self._synced_in: int | None = None
        """The round whose sync gave every member the same state (None: not synced since
        it was created or loaded a checkpoint)."""
        self._commits_since_sync = 0

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The live state by name (tensors by reference: the snapshot copies them)."""

    @abc.abstractmethod
    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Set the live state from a snapshot's (or checkpoint's) contents; their tensors
        belong to the snapshot, so copy what is kept."""

    def _deferrable(self) -> Callable[[torch.Tensor], bool]:
        """Which tensors a background commit may copy after ``commit()`` returned."""
        return lambda _tensor: False

    def _meta(self) -> dict[str, Any]:
        """What a checkpoint's manifest says about the commit: the ``epoch`` attribute (0
        without one), the runtime's step and round."""
        epoch = getattr(self, "epoch", 0)
        epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0
        if not is_initialized():
            return {"epoch": epoch, "step": 0, "round": 0}
        runtime = current()
        return {"epoch": epoch, "step": runtime.step, "round": runtime.round}

    def save(self) -> None:
        self._keeper.capture(self.state_dict(), self._meta(), self._deferrable())

    def restore(self) -> None:
        snapshot = self._keeper.committed()
        assert snapshot is not None
        self.load_state_dict(snapshot.value())

    def sync(self) -> None:
        self._keeper.wait()
        self._holds_job_state = True
        self._sync_live()
        self.save()
        self._synced_in = current().round if is_initialized() else None
        self._commits_since_sync = 0

    def commit_token(self) -> tuple[int, int] | None:
        """(the round of the last sync, commits since): the members of a round synced
        together and commit in lockstep, so equal tokens mean equal commits."""
        if self._synced_in is None:
            return None
        return (self._synced_in, self._commits_since_sync)

    @abc.abstractmethod
    def _sync_live(self) -> None:
        """Replace the live state with rank 0's."""

    def commit(self) -> None:
        self._holds_job_state = True
        self._commits_since_sync += 1
        super().commit()

    def after_commit(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.after_commit(current().slot.rank)

    @property
    def writes_checkpoints(self) -> bool:
        return self._checkpointer is not None

    def checkpoint(self) -> None:
        """Write the committed state as a durable checkpoint now, on rank 0 (other ranks do
        nothing), on the writer thread: waits only for a checkpoint still being written.

        Raises :class:`RuntimeError` when the job has no checkpoint folder."""
        if self._checkpointer is None:
            super().checkpoint()
            return
        if not is_initialized() or current().slot.rank == 0:
            self._checkpointer.write_now()

    def finish_checkpoints(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def checkpoint_for_suspension(self) -> bool:
        saved = super().checkpoint_for_suspension()
        failed = self._checkpointer is not None and self._checkpointer.last_write_failed
        if failed:
            logger.error("the suspension's checkpoint could not be written")
        return saved and not failed

    def resume_from_checkpoint(self) -> CheckpointReport | None:
        if self._holds_job_state or self._checkpointer is None:
            return None
        self._holds_job_state = True
        self._keeper.wait()
        return load_newest(self._checkpointer.folder, self._apply_checkpoint)

    def _apply_checkpoint(self, value: Any, manifest: Manifest) -> None:
        if not isinstance(value, dict) or set(value) != set(self.state_dict()):
            raise CheckpointError("it holds other attributes than this state")
        check_fits(value, self.state_dict())
        try:
            self.load_state_dict(value)
        except Exception as exc:
            self.restore()
            raise CheckpointError(f"it does not fit the state: {exc}") from exc
        if is_initialized():
            current().step = manifest.step
        self.save()
        self._synced_in = None


def check_fits(saved: Any, live: Any, path: str = "") -> None:
    """Raise :class:`CheckpointError` where a tensor in ``saved`` has another shape or dtype
    than the live tensor at the same place (a checkpoint of another model)."""
    if isinstance(saved, torch.Tensor) and isinstance(live, torch.Tensor):
        if saved.shape != live.shape or saved.dtype != live.dtype:
            raise CheckpointError(
                f"{path or 'a tensor'} is {tuple(saved.shape)} {saved.dtype} in the checkpoint "
                f"but {tuple(live.shape)} {live.dtype} in the state (another model?)"
            )
    elif isinstance(saved, dict) and isinstance(live, dict):
        for key in (k for k in saved if k in live):
            check_fits(saved[key], live[key], f"{path}.{key}" if path else str(key))
    elif isinstance(saved, (list, tuple)) and isinstance(live, (list, tuple)):
        for i, (a, b) in enumerate(zip(saved, live, strict=False)):
            check_fits(a, b, f"{path}[{i}]")


class ObjectState(SnapshotState):
    """State made of picklable attributes given as keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for name, value in saved.items():
            setattr(self, name, copy.deepcopy(value))

    def _sync_live(self) -> None:
        for name, value in broadcast_object(self.state_dict(), root_rank=0).items():
            setattr(self, name, value)


class TorchState(SnapshotState):
    """State of a PyTorch training loop (Horovod's ``hvd.elastic.TorchState``): a model, an
    optimizer and any other attributes (samplers, epoch and batch counters...).

    ``background_commit``: ``commit()`` copies the tensors that only the optimizers' steps
    change (parameters, optimizer state) on a background thread while the next forward and
    backward pass run; the optimizers' next ``step()`` waits for it. Use it when parameters
    change only through the optimizers given here; everything else is copied at once."""

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
        *,
        background_commit: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(background_commit=background_commit)
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        self._handlers: dict[str, StateHandler] = {
            name: self.handler_for(value) for name, value in values.items()
        }
        if background_commit:
            for optim in self._optimizers():
                optim.register_step_pre_hook(self._before_step)
        self.save()

    @classmethod
    def handler_for(cls, value: Any) -> StateHandler:
        """The handler of the registry's first type ``value`` is (else an object's)."""
        for kind, handler in cls.handler_registry:
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

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [h.value for h in self._handlers.values() if isinstance(h, OptimizerStateHandler)]

    def _before_step(self, *_args: Any) -> None:
        if self._keeper.copying:
            self._keeper.wait()

    def _deferrable(self) -> Callable[[torch.Tensor], bool]:
        stepped: set[int] = set()
        for optim in self._optimizers():
            for group in optim.param_groups:
                stepped.update(p.data_ptr() for p in group["params"])
            for per_param in optim.state.values():
                stepped.update(t.data_ptr() for t in find_tensors(per_param))
        return lambda tensor: tensor.numel() > 0 and tensor.data_ptr() in stepped

    def state_dict(self) -> dict[str, Any]:
        return {name: handler.state_dict() for name, handler in self._handlers.items()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for name, handler in self._handlers.items():
            handler.load_state_dict(saved[name])

    def _sync_live(self) -> None:
        for handler in self._handlers.values():
            handler.sync()

    def on_reset(self) -> None:
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()
