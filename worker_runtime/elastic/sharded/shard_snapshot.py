"""A sharded model's committed state in host memory: each rank's own shards of the FSDP2
model's parameters and of its optimizer's state, flattened by name (``torch.distributed.
checkpoint.state_dict``), and the entries every rank holds alike (the optimizer's step count
and its hyperparameters).

:func:`take_snapshot` copies the live shards to host memory; :func:`load_shards` builds the
new world's state dicts from rows of the old shards and loads them into a model and optimizer
freshly sharded over the new world. Nothing here ever gathers a whole tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

FLAT: Final = StateDictOptions(flatten_optimizer_state_dict=True)
"""State dicts by flat name (``state.<param>.exp_avg``), so every entry is one tensor."""

MODEL, OPTIMIZER = "model", "optimizer"


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
    """A commit of one rank: its shards and what every rank holds alike."""

    world: int
    rank: int
    sharded: dict[tuple[str, str], ShardedEntry] = field(default_factory=dict)
    replicated: dict[tuple[str, str], Any] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Host memory the shards take."""
        return sum(e.local.numel() * e.local.element_size() for e in self.sharded.values())


def _is_row_sharded(value: DTensor) -> bool:
    placements = value.placements
    return len(placements) == 1 and isinstance(placements[0], Shard) and placements[0].dim == 0


def take_snapshot(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: int, rank: int
) -> ShardSnapshot:
    """Copy ``model``'s and ``optimizer``'s live state to host memory (this rank's shards of
    the sharded tensors; the rest as it is). Raises :class:`TypeError` for a tensor sharded
    otherwise than FSDP2 shards (dimension 0 over one mesh dimension)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=FLAT)
    snapshot = ShardSnapshot(world, rank)
    for kind, state in ((MODEL, model_state), (OPTIMIZER, optimizer_state)):
        for name, value in state.items():
            key = (kind, name)
            if isinstance(value, DTensor):
                if not _is_row_sharded(value):
                    raise TypeError(
                        f"{kind} entry {name} is placed {value.placements}: a sharded state "
                        "holds FSDP2 shards (Shard(0) over a one-dimensional mesh)"
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
) -> None:
    """Load this rank's new shards ``locals_`` (of tensors of global ``shapes``) and the
    ``replicated`` entries into ``model`` and ``optimizer``, freshly sharded over ``mesh``."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    states: dict[str, dict[str, Any]] = {MODEL: {}, OPTIMIZER: {}}
    for (kind, name), local in locals_.items():
        shape = torch.Size(shapes[(kind, name)])
        stride = torch.empty(shape, device="meta").stride()
        states[kind][name] = DTensor.from_local(
            local.to(device), mesh, [Shard(0)], run_check=False, shape=shape, stride=stride
        )
    for (kind, name), value in replicated.items():
        states[kind][name] = value.clone() if isinstance(value, torch.Tensor) else value
    set_state_dict(
        model,
        optimizer,
        model_state_dict=states[MODEL],
        optim_state_dict=states[OPTIMIZER],
        options=FLAT,
    )


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
