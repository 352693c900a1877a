"""New shards loaded into a model and optimizer freshly sharded over a new world.

:func:`load_shards` builds the new world's state dicts from this rank's new rows of a commit
(``shard_exchange.reshard``'s) and loads them, in place where they are what the common case
gives (:func:`load_in_place`), else with torch's ``set_state_dict``. Memory is written once:
a parameter and the optimizer take the tensors a reshard assembled as they are, and the
tensors of a commit (which training must not change) are copied, into the memory of the
round before where this rank kept its shard (:func:`round_memory`): its pages are in
memory already, where a new tensor's are faulted in and zeroed one by one as the copy first
writes them, most of a load's time where several ranks share a few cores. The optimizer's
copies are made beside the first forward and backward pass (:class:`StateCopies`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeGuard

import torch
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.sharded.shard_plan import Key
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (
    FLAT,
    GROUPS,
    MODEL,
    OPTIMIZER,
    placements,
    set_optimizer_groups,
)

logger = get_logger(__name__)


def load_shards(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh: DeviceMesh,
    shapes: Mapping[Key, tuple[int, ...]],
    locals_: Mapping[Key, torch.Tensor],
    replicated: Mapping[Key, Any],
    borrowed: Collection[Key] = frozenset(),
    spare: Mapping[Key, torch.Tensor] | None = None,
) -> StateCopies:
    """Load this rank's new shards ``locals_`` (of tensors of global ``shapes``) and the
    ``replicated`` entries into ``model`` and ``optimizer``, freshly sharded over ``mesh``.
    An optimizer committed before its first step is given its groups' hyperparameters and
    no state. The parameters and the optimizer's state take the tensors of ``locals_`` as
    they are (no copy), except the ``borrowed`` entries (a commit's own tensors, which
    training must not change): those are copied, into the ``spare`` tensor of the same key
    (:func:`round_memory`) where it has their shape, dtype and device: the parameters' now,
    the optimizer's once the caller starts the :class:`StateCopies` returned (on a thread of
    their own, beside training)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    replicated = dict(replicated)
    groups = replicated.pop(GROUPS, None)
    states: dict[str, dict[str, Any]] = {MODEL: {}, OPTIMIZER: {}}
    spare = spare or {}
    params = dict(model.named_parameters())
    taken: set[str] = set()
    """The parameters that take their new tensor as it is."""
    later: list[tuple[torch.Tensor, torch.Tensor]] = []
    """The optimizer state copied beside the first step: (into, from)."""
    for key, local in locals_.items():
        kind, name = key
        into = spare.get(key)
        own = key not in borrowed  # rows the reshard assembled for this rank
        if own:
            data = local.to(device)
        elif kind == OPTIMIZER and _stays_as_placed(params, name, local):
            data = _memory_for(local, device, into)
            later.append((data, local))
        elif kind == OPTIMIZER or _fits(into, local, device):
            data, own = _memory_for(local, device, into).copy_(local), True
        else:
            data = local  # a commit's rows of a parameter: copied into the parameter
        if kind == MODEL and own:
            taken.add(name)
        shape = torch.Size(shapes[key])
        states[kind][name] = DTensor.from_local(
            data,
            mesh,
            placements(mesh),
            run_check=False,
            shape=shape,
            stride=torch.empty(shape, device="meta").stride(),
        )
    for (kind, name), value in replicated.items():
        states[kind][name] = value.clone() if isinstance(value, torch.Tensor) else value
    copies = StateCopies(later)
    if not load_in_place(model, optimizer, states[MODEL], states[OPTIMIZER], taken):
        copies.wait()  # torch's loader reads every entry now
        if groups is not None:
            set_model_state_dict(model, states[MODEL], options=FLAT)
        else:
            set_state_dict(
                model,
                optimizer,
                model_state_dict=states[MODEL],
                optim_state_dict=states[OPTIMIZER],
                options=FLAT,
            )
    if groups is not None:
        set_optimizer_groups(optimizer, groups)
    return copies


class StateCopies:
    """Copies of a commit's optimizer state into the optimizer that loaded it, made on a
    thread of their own: an optimizer reads its state only when it steps, after the first
    forward and backward pass, which run meanwhile (a parameter is needed at once: its rows
    are copied before). :meth:`wait` before anything reads that state: the optimizer's step,
    a snapshot, the end of the round."""

    def __init__(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._copies = list(copies)
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self.waited_s = 0.0
        """How long :meth:`wait` blocked, in all."""

    def start(self) -> None:
        """Make the copies on their thread."""
        if self._copies:
            self._thread = threading.Thread(
                target=self._copy_all, name="elasticjob-state-copies", daemon=True
            )
            self._thread.start()

    def wait(self) -> None:
        """Return once every copy is made (made here, where they were not started); raise
        what made one fail."""
        started = time.monotonic()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        elif self._copies:
            self._copy_all()
        self.waited_s += time.monotonic() - started
        failed, self._failed = self._failed, None
        if failed is not None:
            raise RuntimeError(
                f"copying the committed optimizer state failed: {failed}"
            ) from failed

    def _copy_all(self) -> None:
        copies, self._copies = self._copies, []
        try:
            with torch.no_grad():
                for into, source in copies:
                    into.copy_(source)
        except Exception as exc:  # raised by wait(), on the training thread
            self._failed = exc


def _stays_as_placed(params: Mapping[str, torch.Tensor], entry: str, local: torch.Tensor) -> bool:
    """Whether the optimizer state ``entry`` (``state.<parameter>.<name>``) of rows ``local``
    is kept as it is when loaded (``_placed``: its parameter's dtype), so that it may be
    copied into after the load."""
    param = params.get(_flat_parts(entry)[1])
    return param is not None and param.dtype == local.dtype


def _flat_parts(key: str) -> tuple[str, str, str]:
    """A flat optimizer entry's section, parameter and name: ``state.<parameter>.<name>``
    or ``param_groups.<parameter>.<hyperparameter>``."""
    section, _, rest = key.partition(".")
    parameter, _, name = rest.rpartition(".")
    return section, parameter, name


def load_in_place(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any],
    taken: Collection[str] = frozenset(),
) -> bool:
    """Load flat state dicts (:data:`FLAT`, the new shards as DTensors over the model's mesh)
    straight into the model's parameters and the optimizer's state, when they are what the
    common case gives: the model's entries are its parameters, by name, and the optimizer's
    are ``state.<parameter>.<entry>`` and ``param_groups.<parameter>.<hyperparameter>``.
    Returns False, having changed nothing, for anything else (buffers, nested optimizer
    state, renamed parameters), which torch's ``set_state_dict`` loads.

    torch's loader first steps an optimizer without state on zero gradients, to make its
    state, then copies every entry into it: a whole optimizer step and a second copy of the
    state, several seconds for a model of 100M parameters on a few cores. Here the
    optimizer keeps the new shards as its state, the parameters named in ``taken`` take
    theirs as they are (:func:`_take`), and the others' rows are copied into them."""
    params = dict(model.named_parameters())
    if model_state.keys() != params.keys():
        return False
    per_param: dict[str, dict[str, Any]] = {name: {} for name in params}
    hyper: dict[str, dict[str, Any]] = {name: {} for name in params}
    for key, value in optimizer_state.items():
        section, name, entry = _flat_parts(key)
        if name not in params or section not in ("state", "param_groups"):
            return False
        (per_param if section == "state" else hyper)[name][entry] = value
    names = {id(param): name for name, param in params.items()}
    if any(id(p) not in names for group in optimizer.param_groups for p in group["params"]):
        return False
    copied = params.keys() - _take(model, params, {name: model_state[name] for name in taken})
    with torch.no_grad():
        for name in copied:
            _local(params[name]).copy_(_local(model_state[name]))
    optimizer.state.clear()
    for group in optimizer.param_groups:
        if group["params"]:  # a group's parameters share its hyperparameters
            group.update(copy.deepcopy(hyper[names[id(group["params"][0])]]))
        for param in group["params"]:
            entries = per_param[names[id(param)]]
            if entries:
                optimizer.state[param] = {
                    entry: _placed(value, param, group, entry) for entry, value in entries.items()
                }
    return True


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _placed(value: Any, param: torch.Tensor, group: Mapping[str, Any], entry: str) -> Any:
    """An optimizer state entry as ``Optimizer.load_state_dict`` places it: the step count
    as it is, but in float32 on the parameter's device for a fused or capturable optimizer
    (their kernels read it there); every other tensor in the parameter's dtype (when that
    is a floating-point one) on its device."""
    if not isinstance(value, torch.Tensor):
        return value
    if entry == "step":
        if group.get("fused") or group.get("capturable"):
            return value.to(dtype=torch.float32, device=param.device)
        return value
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device)
    return value.to(device=param.device)


def _take(
    model: torch.nn.Module, params: Mapping[str, torch.Tensor], state: Mapping[str, DTensor]
) -> Collection[str]:
    """Make the parameters of ``model`` (``params``, by name) named in ``state`` hold its
    tensors (their shards, placed as they are) instead of copying them in; return the names
    of those that do.

    This is ``load_state_dict(assign=True)`` with torch's swap of tensors
    (``torch.__future__.set_swap_module_params_on_conversion``), which keeps each parameter
    object (the optimizer holds them), and which FSDP2 follows: its hook after a load points
    its sharded storage at the new local tensor. A parameter whose tensor differs in dtype,
    device or contiguity is not taken, nor any where torch refuses the swap."""
    fitting = {
        name: value
        for name, value in state.items()
        if isinstance(params[name], DTensor)
        and value.dtype == params[name].dtype
        and value.device == params[name].device
        and value.to_local().is_contiguous()
    }
    if not fitting:
        return ()
    swaps = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.load_state_dict(fitting, strict=False, assign=True)
    except RuntimeError as refused:
        logger.debug("parameters copied, not taken: %s", refused)
        return ()  # some may be taken: copying into every parameter is right either way
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swaps)
    return fitting.keys()


def round_memory(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[Key, torch.Tensor]:
    """The local tensors of ``model``'s sharded parameters and of ``optimizer``'s state of
    them, by the key of their entry in a snapshot: memory that a later load of the same
    shards may copy a commit into (:func:`load_shards`' ``spare``), once the model and
    optimizer are not used any more."""
    found: dict[Key, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            found[(MODEL, name)] = param.to_local().detach()
        for entry, value in optimizer.state.get(param, {}).items():
            if isinstance(value, DTensor):
                found[(OPTIMIZER, f"state.{name}.{entry}")] = value.to_local().detach()
    return found


def _fits(
    into: torch.Tensor | None, local: torch.Tensor, device: torch.device
) -> TypeGuard[torch.Tensor]:
    """Whether ``local`` can be copied into ``into`` as it is (same shape, dtype, device)."""
    return (
        into is not None
        and into.shape == local.shape
        and into.dtype == local.dtype
        and into.device == device
        and into.is_contiguous()
    )


def _memory_for(
    local: torch.Tensor, device: torch.device, into: torch.Tensor | None
) -> torch.Tensor:
    """Where a copy of ``local`` on ``device`` goes: ``into`` where it fits, else a new
    tensor (not written yet)."""
    return into if _fits(into, local, device) else torch.empty_like(local, device=device)
