"""A sharded model's committed state in host memory: each rank's own shards of the FSDP2
model's parameters and of its optimizer's state, flattened by name (``torch.distributed.
checkpoint.state_dict``), and the entries every rank holds alike (the optimizer's step count
and its hyperparameters).

:func:`take_snapshot` copies the live shards to host memory (``shard_load.py`` loads new
shards back into a model sharded over a new world). Nothing here ever gathers a whole tensor.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
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
