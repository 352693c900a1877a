"""kopf handlers: thin adapters from Kubernetes events to the job supervisor and controllers.

Every handler is ``async``: kopf runs those on its event loop, where the controllers live (it
would run a plain function in a thread, from where it must not touch their state or wake
them)."""

from __future__ import annotations

from typing import Any

import kopf

from elasticjob.operator import pods as podlib
from elasticjob.operator.api import GROUP, LABEL_ROLE, PLURAL, ROLE_WORKER, VERSION, validate
from elasticjob.operator.api.field_error import FieldError
from elasticjob.operator.api.validation import name_errors, namespace_errors, suspend_errors
from elasticjob.operator.api.validation import validate_scale as scale_errors
from elasticjob.operator.operator_process import OperatorRuntime

REGISTRY = kopf.get_default_registry()
"""The registry these handlers are registered in."""


def _runtime(memo: Any) -> OperatorRuntime:
    runtime: OperatorRuntime = memo.runtime
    return runtime


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    await _runtime(memo).start(settings)


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    await _runtime(memo).stop()


@kopf.on.probe(id="rendezvous")
async def probe_rendezvous(memo: Any, **_: Any) -> str:
    """Part of the health endpoint's answer (liveness and readiness): fails the probe when
    workers cannot be served, or admission is not registered yet."""
    return await _runtime(memo).check_health()


# The validation webhooks are persistent: kopf takes a replica's other webhooks out of the
# configuration when the replica exits, and so a rolling upgrade or the restart of one replica
# left every later ElasticJob unchecked (the replicas that stay never register again).
@kopf.on.validate(
    GROUP,
    VERSION,
    PLURAL,
    id="validate-spec",
    operations=["CREATE", "UPDATE"],
    persistent=True,
)
async def validate_job(
    spec: kopf.Spec, name: str | None, namespace: str | None, memo: Any, **kwargs: Any
) -> None:
    """Refuse specs that break rules the CRD schema cannot express (min <= replicas <= max,
    a worker container, no unknown pod template fields...), names too long to label the
    job's pods, a job in the operator's own namespace, and a suspension that would lose a
    trained job's work unconfirmed, naming the field."""
    runtime = _runtime(memo)
    errors = validate(dict(spec), runtime.pod_schema)
    old = kwargs.get("old")  # the stored job, on an update (kopf's typing leaves it out)
    where = namespace_errors(namespace, runtime.operator_namespace)
    _refuse([*name_errors(name), *where, *errors, *suspend_errors(dict(spec), old)])


@kopf.on.validate(
    GROUP,
    VERSION,
    PLURAL,
    id="validate-scale",
    subresource="scale",
    operations=["UPDATE"],
    persistent=True,
)
async def validate_scale(
    body: kopf.Body, namespace: str | None, name: str | None, memo: Any, **_: Any
) -> None:
    """Refuse ``kubectl scale`` (the scale subresource) outside the stored job's
    minReplicas..maxReplicas."""
    assert namespace is not None and name is not None
    job = await _runtime(memo).api.read_job(namespace, name)
    replicas = int((body.get("spec") or {}).get("replicas") or 0)
    _refuse(scale_errors(job.get("spec") or {}, replicas))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Start, update and stop the job's controller (no kopf daemon: see supervisor.py)."""
    await _runtime(memo).jobs.observe(event.get("type"), body)


@kopf.on.event("", "v1", "pods", labels={LABEL_ROLE: ROLE_WORKER})
async def pod_event(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, memo: Any, **_: Any
) -> None:
    job = podlib.job_of(body)
    controller = _runtime(memo).controllers.get((namespace or "", job or ""))
    if controller is not None:
        controller.on_pod_event(event.get("type") or "ADDED", body)


@kopf.on.event("", "v1", "nodes")
async def node_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    name = body["metadata"]["name"]
    ready = [
        c for c in (body.get("status") or {}).get("conditions", []) if c.get("type") == "Ready"
    ]
    not_ready = _runtime(memo).not_ready_nodes
    if event.get("type") == "DELETED" or not ready or ready[0].get("status") != "True":
        not_ready.add(name)
    else:
        not_ready.discard(name)


def _refuse(errors: list[FieldError]) -> None:
    if errors:
        raise kopf.AdmissionError("; ".join(f"{e.field}: {e.message}" for e in errors), code=422)
