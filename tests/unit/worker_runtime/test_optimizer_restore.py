"""A rollback copies the committed optimizer state into the optimizer's own tensors; when
the state's structure changed since the commit, it loads the state whole instead."""

from __future__ import annotations

import copy
from typing import Any

import torch

from elasticjob.worker_runtime.elastic.state_handlers import (
    OptimizerStateHandler,
    copy_optimizer_state,
    loads_plainly,
)
from elasticjob.worker_runtime.training.optimizer import DistributedMixin


def trained(steps: int, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()


def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def test_the_committed_state_is_copied_into_the_live_tensors() -> None:
    model, optimizer = setup()
    trained(2, optimizer, model)
    committed = copy.deepcopy(optimizer.state_dict())
    live = [t for entries in optimizer.state.values() for t in entries.values()]
    trained(3, optimizer, model)
    optimizer.param_groups[0]["lr"] = 0.5
    OptimizerStateHandler(optimizer).load_state_dict(committed)
    restored = optimizer.state_dict()
    assert restored["param_groups"] == committed["param_groups"]
    for index, entries in committed["state"].items():
        for name, value in entries.items():
            assert torch.equal(restored["state"][index][name], value), (index, name)
    now = [t for entries in optimizer.state.values() for t in entries.values()]
    assert all(a is b for a, b in zip(now, live, strict=True)), "no tensor was replaced"


def test_a_changed_structure_is_not_copied_and_loads_whole() -> None:
    model, optimizer = setup()
    committed = copy.deepcopy(optimizer.state_dict())  # before the first step: no state yet
    trained(1, optimizer, model)
    assert copy_optimizer_state(optimizer, committed) is False
    assert len(optimizer.state) == 4, "nothing changed"
    OptimizerStateHandler(optimizer).load_state_dict(committed)
    assert len(optimizer.state) == 0

    model, optimizer = setup()
    trained(1, optimizer, model)
    committed = copy.deepcopy(optimizer.state_dict())
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    assert copy_optimizer_state(optimizer, committed) is False


def test_a_tensor_of_another_shape_is_not_copied() -> None:
    model, optimizer = setup()
    trained(1, optimizer, model)
    committed = copy.deepcopy(optimizer.state_dict())
    committed["state"][0]["exp_avg"] = torch.zeros(7)
    before = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    assert copy_optimizer_state(optimizer, committed) is False
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], before)


class _Reducer:
    """Stands in for the DistributedOptimizer's gradient reducer: records a discard."""

    discarded = False

    def discard(self) -> None:
        self.discarded = True


def test_a_distributed_optimizer_forgets_its_reduction_on_the_in_place_path() -> None:
    """After ``synchronize()`` and a failed round, the next step must reduce again."""
    model, optimizer = setup()
    trained(1, optimizer, model)
    committed = copy.deepcopy(optimizer.state_dict())
    optimizer.__class__ = type("Adam", (DistributedMixin, torch.optim.Adam), {})
    reducer = _Reducer()
    optimizer._ej_reducer = reducer  # type: ignore[attr-defined]
    optimizer._ej_synchronized_at = 3  # type: ignore[attr-defined]
    live = next(iter(optimizer.state.values()))["exp_avg"]
    assert loads_plainly(optimizer)
    OptimizerStateHandler(optimizer).load_state_dict(committed)
    assert reducer.discarded and optimizer._ej_synchronized_at is None  # type: ignore[attr-defined]
    assert next(iter(optimizer.state.values()))["exp_avg"] is live, "copied in place"


class _OwnLoad(torch.optim.Adam):
    loaded = 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded += 1
        super().load_state_dict(state_dict)


def test_an_optimizer_with_its_own_load_or_load_hooks_is_loaded_by_its_load_state_dict() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    own = _OwnLoad(model.parameters())
    trained(1, own, model)
    assert not loads_plainly(own)
    OptimizerStateHandler(own).load_state_dict(copy.deepcopy(own.state_dict()))
    assert own.loaded == 1

    _, hooked = setup()
    calls: list[str] = []
    hooked.register_load_state_dict_post_hook(lambda opt: calls.append("post"))
    assert not loads_plainly(hooked)
    OptimizerStateHandler(hooked).load_state_dict(copy.deepcopy(hooked.state_dict()))
    assert calls == ["post"]
    assert loads_plainly(setup()[1])
