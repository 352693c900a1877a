"""Create-or-update: one ``upsert`` that follows what each API error means, and the API calls
that create or update an object through it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_transport import KubeTransport, upsert


def error(status: int, reason: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"reason": reason, "message": reason})
    return exc


EXISTS = error(409, "AlreadyExists")
GONE = error(404, "NotFound")
INVALID = error(422, "Invalid")


class Steps:
    """Scripted answers of a create and an update, in the order they are called."""

    def __init__(self, *answers: str | ApiException) -> None:
        self._answers = list(answers)
        self.calls: list[str] = []

    def step(self, name: str) -> Callable[[], Any]:
        async def call() -> str:
            self.calls.append(name)
            answer = self._answers.pop(0)
            if isinstance(answer, ApiException):
                raise answer
            return answer

        return call


@pytest.mark.parametrize(
    ("answers", "update_first", "keep", "calls", "result"),
    [
        pytest.param(["made"], False, False, ["create"], "made", id="created"),
        pytest.param(
            [EXISTS, "patched"], False, False, ["create", "update"], "patched", id="exists"
        ),
        pytest.param([EXISTS], False, True, ["create"], None, id="exists-kept"),
        pytest.param(["patched"], True, False, ["update"], "patched", id="update-first"),
        pytest.param([GONE, "made"], True, False, ["update", "create"], "made", id="missing"),
        pytest.param(
            [GONE, EXISTS, "patched"],
            True,
            False,
            ["update", "create", "update"],
            "patched",
            id="made-in-between",
        ),
        pytest.param(["made"], True, True, ["create"], "made", id="update-first-kept"),
    ],
)
async def test_upsert(
    answers: list[str | ApiException],
    update_first: bool,
    keep: bool,
    calls: list[str],
    result: str | None,
) -> None:
    steps = Steps(*answers)
    update = None if keep else steps.step("update")
    assert await upsert(steps.step("create"), update, update_first=update_first) == result
    assert steps.calls == calls


@pytest.mark.parametrize(
    ("answers", "update_first", "raised", "calls"),
    [
        pytest.param([INVALID], False, INVALID, ["create"], id="create-refused"),
        pytest.param([GONE], False, GONE, ["create"], id="create-not-found"),
        pytest.param([EXISTS, INVALID], False, INVALID, ["create", "update"], id="update-refused"),
        pytest.param(
            [GONE, EXISTS, GONE],
            True,
            GONE,
            ["update", "create", "update"],
            id="deleted-and-made-again-each-time",
        ),
    ],
)
async def test_upsert_raises(
    answers: list[str | ApiException], update_first: bool, raised: ApiException, calls: list[str]
) -> None:
    steps = Steps(*answers)
    with pytest.raises(ApiException) as caught:
        await upsert(steps.step("create"), steps.step("update"), update_first=update_first)
    assert caught.value is raised
    assert steps.calls == calls


class ScriptedTransport(KubeTransport):
    """Answers each call by its name, from a script (an error is raised), and records it."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        super().__init__()
        self._answers = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _answer(self, what: str, args: tuple[Any, ...]) -> Any:
        self.calls.append((what, args))
        answer = self._answers[what].pop(0)
        if isinstance(answer, ApiException):
            raise answer
        return answer

    async def call(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._answer(what, args)

    async def call_json(
        self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        answer: dict[str, Any] = self._answer(what, args)
        return answer

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        answer: dict[str, Any] = self._answer(what, (method, path, body))
        return answer


async def test_a_record_config_map_is_patched_and_made_when_missing() -> None:
    transport = ScriptedTransport({"patch config map": [GONE], "create config map": [{}]})
    config_map = {"metadata": {"name": "rec"}, "data": {"k": "v"}}
    await KubeApi(transport).apply_config_map("ns", config_map)
    assert transport.calls == [
        ("patch config map", ("rec", "ns", {"data": {"k": "v"}})),
        ("create config map", ("ns", config_map)),
    ]


async def test_a_secret_whose_name_is_taken_is_kept() -> None:
    transport = ScriptedTransport({"create secret": [EXISTS, {"kind": "Secret"}]})
    api = KubeApi(transport)
    assert await api.create_secret("ns", {"metadata": {"name": "s"}}) is None
    assert await api.create_secret("ns", {"metadata": {"name": "s"}}) == {"kind": "Secret"}


async def test_an_existing_budget_gets_the_new_spec() -> None:
    transport = ScriptedTransport(
        {"create PodDisruptionBudget": [EXISTS], "update PodDisruptionBudget": [{}]}
    )
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "b"},
        "spec": {"minAvailable": 2},
    }
    await KubeApi(transport).apply_owned("ns", budget, "poddisruptionbudgets")
    base = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
    assert transport.calls == [
        ("create PodDisruptionBudget", ("POST", base, budget)),
        ("update PodDisruptionBudget", ("PATCH", f"{base}/b", {"spec": {"minAvailable": 2}})),
    ]


async def test_webhook_configurations_are_made_or_given_their_owner() -> None:
    transport = ScriptedTransport(
        {
            "create validating webhook configuration": [EXISTS],
            "own validating webhook configuration": [{}],
            "create mutating webhook configuration": [{}],
        }
    )
    owner = {"kind": "ClusterRole", "name": "r", "uid": "u"}
    await KubeApi(transport).own_webhook_configurations("hooks", owner)
    body = {"metadata": {"name": "hooks", "ownerReferences": [owner]}}
    assert transport.calls == [
        ("create validating webhook configuration", (body,)),
        ("own validating webhook configuration", ("hooks", body)),
        ("create mutating webhook configuration", (body,)),
    ]
