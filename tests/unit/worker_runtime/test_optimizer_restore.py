"""A rollback copies the committed optimizer state into the optimizer's own tensors; when
the state's structure changed since the commit, it loads the state whole instead."""

from __future__ import annotations

import copy

import torch

from elasticjob.worker_runtime.elastic.handlers import OptimizerStateHandler, copy_optimizer_state


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
