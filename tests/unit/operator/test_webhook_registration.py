"""When the operator counts its admission webhook as registered: the API server's
ValidatingWebhookConfiguration sends reviews to a server with this operator's CA bundle."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.operator.webhook import serves_this_server

OURS = "b3Vycw=="
HOOK = {"name": "validate-spec.ej.svc", "clientConfig": {"caBundle": OURS}}


@pytest.mark.parametrize(
    ("configuration", "registered"),
    [
        pytest.param(None, False, id="no-configuration"),
        pytest.param({"metadata": {"name": "ej"}}, False, id="created-empty-by-the-operator"),
        pytest.param({"webhooks": None}, False, id="webhooks-null"),
        pytest.param(
            {"webhooks": [{**HOOK, "clientConfig": {"caBundle": "b2xk"}}]},
            False,
            id="a-previous-operators-ca",
        ),
        pytest.param({"webhooks": [{"name": "x"}]}, False, id="no-client-config"),
        pytest.param({"webhooks": [HOOK]}, True, id="this-operators-ca"),
        pytest.param(
            {"webhooks": [{**HOOK, "clientConfig": {"caBundle": "b2xk"}}, HOOK]},
            True,
            id="one-of-several",
        ),
    ],
)
def test_registration_is_a_webhook_with_this_operators_ca(
    configuration: dict[str, Any] | None, registered: bool
) -> None:
    assert serves_this_server(configuration, OURS) is registered
