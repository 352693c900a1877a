"""kopf handlers: thin adapters from Kubernetes events to the job controllers."""

from __future__ import annotations

from typing import Any

import kopf

from elasticjob.operator import pods as podlib
from elasticjob.operator.api import GROUP, LABEL_ROLE, PLURAL, ROLE_WORKER, VERSION, Phase, validate
from elasticjob.operator.controller import JobController
from elasticjob.operator.runtime import OperatorRuntime

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


@kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-spec", operations=["CREATE", "UPDATE"])
def validate_job(spec: kopf.Spec, **_: Any) -> None:
    """Refuse specs that break rules the CRD schema cannot express (min <= replicas <= max,
    a worker container...), naming the field."""
    errors = validate(dict(spec))
    if errors:
        raise kopf.AdmissionError("; ".join(f"{e.field}: {e.message}" for e in errors), code=422)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0, backoff=5.0)
async def run_job(
    body: kopf.Body,
    namespace: str | None,
    name: str,
    stopped: kopf.DaemonStopped,
    memo: Any,
    **_: Any,
) -> None:
    """One controller per ElasticJob, for as long as the job runs and the operator lives."""
    assert namespace is not None
    if (body.get("status") or {}).get("phase") in (Phase.SUCCEEDED.value, Phase.FAILED.value):
        return
    assert namespace is not None and name is not None
    runtime = _runtime(memo)
    controller = JobController(
        namespace,
        name,
        runtime.api,
        runtime.service,
        runtime.controller_settings,
        runtime.not_ready_nodes,
    )
    runtime.controllers[(namespace, name)] = controller
    try:
        await controller.run(body, stopped)
    finally:
        runtime.controllers.pop((namespace, name), None)
    await stopped.wait()  # the job has ended: nothing to do until it is deleted


@kopf.on.event("", "v1", "pods", labels={LABEL_ROLE: ROLE_WORKER})
def pod_event(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, memo: Any, **_: Any
) -> None:
    job = podlib.job_of(body)
    controller = _runtime(memo).controllers.get((namespace or "", job or ""))
    if controller is not None:
        controller.on_pod_event(event.get("type") or "ADDED", body)


@kopf.on.event("", "v1", "nodes")
def node_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    name = body["metadata"]["name"]
    ready = [
        c for c in (body.get("status") or {}).get("conditions", []) if c.get("type") == "Ready"
    ]
    not_ready = _runtime(memo).not_ready_nodes
    if event.get("type") == "DELETED" or not ready or ready[0].get("status") != "True":
        not_ready.add(name)
    else:
        not_ready.discard(name)
