"""Which handler keeps a state attribute, and what a commit and a rollback do to objects tied
to the optimizer (schedulers, a GradScaler): restored in place, still bound to the live
optimizer; an attribute that could never be synced is refused when the state is made."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch

from elasticjob.worker_runtime.elastic.sampler import ElasticSampler
from elasticjob.worker_runtime.elastic.state_handlers import (
    HandledAttributes,
    ModelStateHandler,
    ObjectStateHandler,
    OptimizerStateHandler,
    SamplerStateHandler,
    StatefulHandler,
)


class Attributes(HandledAttributes):
    def __init__(self, **values: Any) -> None:
        self._keep_attributes(values)


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)


class Counter:
    """A script's own object with a state dict."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, saved: dict[str, int]) -> None:
        self.count = saved["count"]


@pytest.mark.parametrize(
    ("value", "handler"),
    [
        (torch.nn.Linear(1, 1), ModelStateHandler),
        (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), OptimizerStateHandler),
        (ElasticSampler(list(range(4)), rank_and_size=lambda: (0, 1)), SamplerStateHandler),
        (Counter(), StatefulHandler),
        (torch.amp.GradScaler("cpu"), StatefulHandler),
        (3, ObjectStateHandler),
        ({"epoch": 1}, ObjectStateHandler),
        (Counter, ObjectStateHandler),  # a class, not an object with a state
    ],
)
def test_each_kind_of_value_has_its_handler(value: Any, handler: type) -> None:
    assert type(HandledAttributes.handler_for(value)) is handler


def scheduler_kinds(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    sched = torch.optim.lr_scheduler
    return {
        "step": sched.StepLR(optimizer, 1, 0.5),
        "lambda": sched.LambdaLR(optimizer, lambda step: 1 / (1 + step)),
        "onecycle": sched.OneCycleLR(optimizer, max_lr=2.0, total_steps=20),
        "sequential": sched.SequentialLR(
            optimizer,
            [sched.LinearLR(optimizer, 0.5, total_iters=2), sched.StepLR(optimizer, 1, 0.5)],
            milestones=[2],
        ),
    }


@pytest.mark.parametrize("kind", ["step", "lambda", "onecycle", "sequential"])
def test_a_rolled_back_scheduler_is_the_live_one_and_drives_the_live_optimizer(kind: str) -> None:
    model, optimizer = model_and_optimizer()
    scheduler = scheduler_kinds(optimizer)[kind]
    state = Attributes(model=model, optimizer=optimizer, scheduler=scheduler)
    committed = copy.deepcopy(state._attribute_states())  # as a commit's snapshot holds it
    lrs = []
    for _ in range(3):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])

    state._load_attributes(committed)

    assert state.scheduler is scheduler and scheduler.optimizer is optimizer
    for expected in lrs:
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == expected


def test_a_rolled_back_grad_scaler_has_its_committed_scale() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    model, optimizer = model_and_optimizer()
    state = Attributes(scaler=scaler)
    loss = model(torch.ones(1, 3)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    committed = copy.deepcopy(state._attribute_states())
    for _ in range(2):
        scaler.scale(model(torch.ones(1, 3)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert scaler.get_scale() == 32.0

    state._load_attributes(committed)

    assert state.scaler is scaler and scaler.get_scale() == 8.0


def test_an_attribute_that_cannot_be_synced_is_refused_when_the_state_is_made() -> None:
    with pytest.raises(TypeError, match=r"'lock' cannot be committed and synced.*state_dict"):
        Attributes(epoch=0, lock=threading.Lock())


def test_a_stateful_attribute_whose_state_cannot_be_pickled_is_refused() -> None:
    counter = Counter()
    counter.count = threading.Lock()  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"'counter' cannot be committed and synced"):
        Attributes(counter=counter)
