"""Elastic state: committed in memory, rolled back on failure, synced from rank 0.

``commit()`` snapshots the state in memory and checks for host updates; ``restore()`` rolls
back to the last snapshot (after a collective failure), the step count with it; ``sync()``
gives every rank rank 0's live state (after a new group formed with newcomers or after a
rollback; rank 0 is always a member of the previous round, so it holds the freshest state,
unless no member survived: then it is a fresh process that loads the newest durable
checkpoint in the sync, see ``checkpoint.py``).

A state is made of what it overrides, ``save``, ``restore`` and ``sync``, and of one
checkpointing strategy, ``checkpointing`` (``checkpoint.Checkpoints``).
:class:`ObjectState` and :class:`TorchState` keep their commits in preallocated snapshot
buffers (``snapshot.py``). :class:`TorchState` keeps each attribute by a
:class:`StateHandler` chosen by type from an extensible registry (models, optimizers,
elastic samplers; anything else is deep-copied and pickled: ``state_handlers.py``).
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, final

import torch

from elasticjob.worker_contract import checkpoint_from_env
from elasticjob.worker_runtime.basics import current, is_initialized
from elasticjob.worker_runtime.collectives.round_syncs import broadcast_object
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.elastic.checkpoint import Checkpointer, Checkpoints, NoCheckpoints
from elasticjob.worker_runtime.elastic.checkpoint_files import CheckpointError, Manifest, epoch_of
from elasticjob.worker_runtime.elastic.host_messages import HostMessages
from elasticjob.worker_runtime.elastic.snapshot import SnapshotKeeper, find_tensors
from elasticjob.worker_runtime.elastic.state_handlers import (
    HandledAttributes,
    OptimizerStateHandler,
)
from elasticjob.worker_runtime.exceptions import HostsUpdatedInterrupt


class State(abc.ABC):
    """Base of elastic state objects (Horovod's ``hvd.elastic.State``): a subclass says how
    to :meth:`save`, :meth:`restore` and :meth:`sync`, and may set :attr:`checkpointing`;
    the rest is the same for every state (``final``)."""

    rebuilt_every_round: ClassVar[bool] = False
    """Whether the state is rebuilt from its commits in every round (its layout follows the
    world): every new round syncs it, and a host update commits its live state first."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._last_updated_timestamp = 0
        """Horovod's attribute of the same name, which scripts may reset; nothing reads it
        here (notices are ordered by sequence number, not by timestamp)."""
        self.checkpointing: Checkpoints = NoCheckpoints()
        """How commits become durable checkpoints (the job's checkpoint folder)."""
        self.commit_token: tuple[int, int] | None = None
        """An identity of the last commit, equal on two ranks only if their commits hold the
        same state (None: unknown; ``elastic.run`` then syncs). After every rank rolled back
        to commits with equal tokens, the next round skips the sync: nothing would change."""

    @property
    def _host_messages(self) -> HostMessages:
        """Horovod's queue of host-update notifications, as a read-only view: scripts poll
        ``state._host_messages.empty()`` to wait until a host change reached this worker."""
        return HostMessages()

    @final
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called after every reset, once the new group exists and before state is
        synced: adjust the learning rate to the new world size, repartition data, rebuild a
        DistributedDataParallel wrapper."""
        self._reset_callbacks.extend(callbacks)

    @final
    def on_reset(self) -> None:
        """Called by ``elastic.run`` after each reset."""
        for callback in self._reset_callbacks:
            callback()

    @final
    def commit(self) -> None:
        """Snapshot the state in memory (and write a durable checkpoint when the job's policy
        says so), then check for host updates (which may raise
        :class:`~elasticjob.worker_runtime.HostsUpdatedInterrupt` on every rank at once)."""
        runtime = current()
        started, started_us = time.monotonic(), timeline.now()
        self.save()
        timeline.span("commit", started_us)
        runtime.reports.commit(time.monotonic() - started)
        self.checkpointing.after_commit(runtime)
        runtime.check_host_updates()  # the live state is committed: an update keeps it

    @final
    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if any rank saw hosts change; a state
        rebuilt every round commits its live state first, so the next round loses nothing."""
        try:
            current().check_host_updates()
        except HostsUpdatedInterrupt:
            if self.rebuilt_every_round:
                self.save()
            raise

    @final
    def checkpoint(self) -> None:
        """Write the last commit as a durable checkpoint now (on rank 0 for a replicated
        state; a sharded one is a collective). Raises :class:`RuntimeError` when the job has
        no checkpoint folder."""
        self.checkpointing.write_now(current())

    @abc.abstractmethod
    def save(self) -> None:
        """Snapshot the live state in memory."""

    @abc.abstractmethod
    def restore(self) -> None:
        """Roll the live state, and the runtime's step count, back to the last snapshot."""

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
            Checkpointer(policy, self._keeper, self._apply_checkpoint)
            if policy is not None
            else None
        )
        if self._checkpointer is not None:
            self.checkpointing = self._checkpointer

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The live state by name (tensors by reference: the snapshot copies them)."""

    @abc.abstractmethod
    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Set the live state from a snapshot's (or checkpoint's) contents; their tensors
        belong to the snapshot, so copy what is kept."""

    @abc.abstractmethod
    def _sync_live(self) -> None:
        """Replace the live state with rank 0's."""

    def _deferrable(self) -> Callable[[torch.Tensor], bool]:
        """Which tensors a background commit may copy after ``commit()`` returned."""
        return lambda _tensor: False

    def _meta(self) -> dict[str, Any]:
        """What a checkpoint's manifest says about the commit: the ``epoch`` attribute (0
        without one), the runtime's step and round."""
        epoch = epoch_of(getattr(self, "epoch", 0))
        if not is_initialized():
            return {"epoch": epoch, "step": 0, "round": 0}
        runtime = current()
        return {"epoch": epoch, "step": runtime.step, "round": runtime.round}

    def save(self) -> None:
        """Snapshot the live state; the commit token counts the snapshots since the sync."""
        self._keeper.capture(self.state_dict(), self._meta(), self._deferrable())
        if self.commit_token is not None:
            synced_in, commits = self.commit_token
            self.commit_token = (synced_in, commits + 1)

    def restore(self) -> None:
        snapshot = self._keeper.committed()
        assert snapshot is not None
        self.load_state_dict(snapshot.value())
        if is_initialized():
            current().step = snapshot.meta["step"]

    def sync(self) -> None:
        """Load the newest durable checkpoint first where this process never held the job's
        state (rank 0 only), then give every rank rank 0's state and snapshot it. The commit
        token becomes (this round, 0 commits since): the members of a round synced together
        and commit in lockstep, so equal tokens mean equal commits."""
        runtime = current() if is_initialized() else None
        self._keeper.wait()
        if self._checkpointer is not None:
            self._checkpointer.resume(runtime.slot.rank if runtime is not None else 0)
        self._sync_live()
        self.save()
        self.commit_token = (runtime.round, 0) if runtime is not None else None

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
        self.commit_token = None


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


class TorchState(HandledAttributes, SnapshotState):
    """State of a PyTorch training loop (Horovod's ``hvd.elastic.TorchState``): a model, an
    optimizer and any other attributes (samplers, epoch and batch counters...), each kept by
    its handler (``TorchState.register_handler`` adds kinds).

    ``background_commit``: ``commit()`` copies the tensors that only the optimizers' steps
    change (parameters, optimizer state) on a background thread while the next forward and
    backward pass run; the optimizers' next ``step()`` waits for it. Use it when parameters
    change only through the optimizers given here; everything else is copied at once."""

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
        self.register_reset_callbacks(self._keep_attributes(values))
        if background_commit:
            for optim in self._optimizers():
                optim.register_step_pre_hook(self._before_step)
        self.save()

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
        return self._attribute_states()

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self._load_attributes(saved)

    def _sync_live(self) -> None:
        self._sync_attributes()
