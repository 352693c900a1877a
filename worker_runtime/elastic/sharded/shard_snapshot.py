"""A sharded model's committed state in host memory: each rank's own shards of the FSDP2
model's parameters and of its optimizer's state, flattened by name (``torch.distributed.
checkpoint.state_dict``), and the entries every rank holds alike (the optimizer's step count
and its hyperparameters).

:func:`take_snapshot` copies the live shards to host memory; :func:`load_shards` builds the
new world's state dicts from rows of the old shards and loads them into a model and optimizer
freshly sharded over the new world. Nothing here ever gathers a whole tensor.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

FLAT: Final = StateDictOptions(flatten_optimizer_state_dict=True)
"""State dicts by flat name (``state.<param>.exp_avg``), so every entry is one tensor."""

MODEL, OPTIMIZER = "model", "optimizer"
GROUPS: Final = ("optimizer-groups", "")
"""The replicated entry of a snapshot taken before the optimizer's first step: its groups'
hyperparameters (it has no state yet, and the optimizer it is loaded into gets none)."""


def optimizer_started(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` took a step (has state). torch's ``get_state_dict`` and
    ``get_optimizer_state_dict`` give an optimizer that has not a state by taking a step on
    zero gradients, which AdamW counts: the run would then follow another trajectory than
    the same loop without elasticity. Never ask them for an optimizer that has not started."""
    return bool(optimizer.state)


def optimizer_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The hyperparameters of ``optimizer``'s groups (everything but their parameters)."""
    return [
        {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]


def set_optimizer_groups(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    """Give ``optimizer``'s groups the hyperparameters ``groups`` (of an optimizer with the
    same groups)."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the committed optimizer had {len(groups)} parameter groups, the one built "
            f"now has {len(optimizer.param_groups)}"
        )
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        group.update(copy.deepcopy(saved))


@dataclass(frozen=True)
class ShardedEntry:
    """One tensor sharded along dimension 0: its global shape, dtype, and this rank's rows."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    local: torch.Tensor
    """This rank's rows, in host memory."""

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0


@dataclass
class ShardSnapshot:
    """A commit of one rank: its shards (shard ``shard`` of ``shards`` of every sharded
    tensor) and what every rank holds alike."""

    shards: int
    shard: int
    sharded: dict[tuple[str, str], ShardedEntry] = field(default_factory=dict)
    replicated: dict[tuple[str, str], Any] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Host memory the shards take."""
        return sum(e.local.numel() * e.local.element_size() for e in self.sharded.values())


def placements(mesh: DeviceMesh) -> list[Shard | Replicate]:
    """How FSDP2 places a tensor on ``mesh``: sharded by rows over its last dimension (the
    shard dimension), replicated over the one before (HSDP's replicate dimension)."""
    return [Replicate()] * (mesh.ndim - 1) + [Shard(0)]


def _is_row_sharded(value: DTensor) -> bool:
    *replicated, sharded = value.placements
    return (
        isinstance(sharded, Shard)
        and sharded.dim == 0
        and all(isinstance(p, Replicate) for p in replicated)
    )


def take_snapshot(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, shards: int, shard: int
) -> ShardSnapshot:
    """Copy ``model``'s and ``optimizer``'s live state to host memory (this rank's shards of
    the sharded tensors, shard ``shard`` of ``shards``; the rest as it is). Raises
    :class:`TypeError` for a tensor sharded otherwise than FSDP2 shards (dimension 0 over
    the mesh's last dimension, replicated over the one before)."""
    snapshot = ShardSnapshot(shards, shard)
    if optimizer_started(optimizer):
        model_state, optimizer_state = get_state_dict(model, optimizer, options=FLAT)
    else:
        model_state, optimizer_state = get_model_state_dict(model, options=FLAT), {}
        snapshot.replicated[GROUPS] = optimizer_groups(optimizer)
    for kind, state in ((MODEL, model_state), (OPTIMIZER, optimizer_state)):
        for name, value in state.items():
            key = (kind, name)
            if isinstance(value, DTensor):
                if not _is_row_sharded(value):
                    raise TypeError(
                        f"{kind} entry {name} is placed {value.placements}: a sharded state "
                        "holds FSDP2 shards (Shard(0) over the mesh's last dimension, "
                        "replicated over the one before)"
                    )
                local = value.to_local().detach().to("cpu", copy=True)
                snapshot.sharded[key] = ShardedEntry(tuple(value.shape), value.dtype, local)
            elif isinstance(value, torch.Tensor):
                snapshot.replicated[key] = value.detach().to("cpu", copy=True)
            else:
                snapshot.replicated[key] = value
    return snapshot


def load_shards(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh: DeviceMesh,
    shapes: Mapping[tuple[str, str], tuple[int, ...]],
    locals_: Mapping[tuple[str, str], torch.Tensor],
    replicated: Mapping[tuple[str, str], Any],
    borrowed: Collection[tuple[str, str]] = frozenset(),
) -> None:
    """Load this rank's new shards ``locals_`` (of tensors of global ``shapes``) and the
    ``replicated`` entries into ``model`` and ``optimizer``, freshly sharded over ``mesh``.
    An optimizer committed before its first step is given its groups' hyperparameters and
    no state. The optimizer keeps the tensors of ``locals_`` as its state (no copy), except
    the ``borrowed`` entries (a commit's own tensors, which training must not change): it
    gets copies of those. The model's parameters are always copied into."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    replicated = dict(replicated)
    groups = replicated.pop(GROUPS, None)
    states: dict[str, dict[str, Any]] = {MODEL: {}, OPTIMIZER: {}}
    for (kind, name), local in locals_.items():
        shape = torch.Size(shapes[(kind, name)])
        stride = torch.empty(shape, device="meta").stride()
        copied = kind == OPTIMIZER and (kind, name) in borrowed
        states[kind][name] = DTensor.from_local(
            local.to(device, copy=copied),
            mesh,
            placements(mesh),
            run_check=False,
            shape=shape,
            stride=stride,
        )
    for (kind, name), value in replicated.items():
        states[kind][name] = value.clone() if isinstance(value, torch.Tensor) else value
    if not load_in_place(model, optimizer, states[MODEL], states[OPTIMIZER]):
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


def load_in_place(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any],
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
    parameters' rows are copied once and the optimizer keeps the new shards as its state."""
    params = dict(model.named_parameters())
    if model_state.keys() != params.keys():
        return False
    per_param: dict[str, dict[str, Any]] = {name: {} for name in params}
    hyper: dict[str, dict[str, Any]] = {name: {} for name in params}
    for key, value in optimizer_state.items():
        section, _, rest = key.partition(".")
        name, _, entry = rest.rpartition(".")
        if name not in params or section not in ("state", "param_groups"):
            return False
        (per_param if section == "state" else hyper)[name][entry] = value
    names = {id(param): name for name, param in params.items()}
    if any(id(p) not in names for group in optimizer.param_groups for p in group["params"]):
        return False
    with torch.no_grad():
        for name, param in params.items():
            value = model_state[name]
            _local(param).copy_(_local(value))
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


def release_group(model: torch.nn.Module, mesh: DeviceMesh | None) -> None:
    """Cut ``model``'s and ``mesh``'s references to the process group they were sharded over
    (the model is not used again). FSDP2's parameter groups hold it in their mesh infos, a
    device mesh in its registry; a version of torch that keeps them elsewhere is left as it
    is (the group then lives until its collectives time out)."""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for group in getattr(get_state(), "_fsdp_param_groups", ()):
            infos = (
                getattr(group, "mesh_info", None),
                getattr(group, "post_forward_mesh_info", None),
            )
            for info in infos:
                for name, value in list(vars(info).items()) if info is not None else ():
                    if isinstance(value, dist.ProcessGroup):
                        object.__setattr__(info, name, None)
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()


def forget_meshes() -> None:
    """Empty DTensor's caches of sharding decisions and redistribution plans, on the
    training thread (Python's sharding decisions are cached per thread), before a round's
    model is built. They hold the meshes they were made for and are looked up by mesh
    *equality* (same ranks, shape and names): a round of an earlier round's shape would
    otherwise shard its new model on that round's mesh (``to_empty`` goes through them),
    whose groups no longer exist (torch fails with "Could not resolve the process group").
    A version of torch without these caches is left as it is."""
    debug = importlib.import_module("torch.distributed.tensor.debug")
    redistribute = importlib.import_module("torch.distributed.tensor._redistribute")
    for clear in (
        getattr(debug, "_clear_sharding_prop_cache", None),  # the C++ one and Python's
        getattr(redistribute, "clear_redistribute_planner_cache", None),
    ):
        if clear is not None:
            clear()
