"""The reference tables of the docs, made from the code they describe: the worker contract's
``ELASTICJOB_*`` variables and the worker defaults (``docs/worker-runtime.md``), the metrics
the operator serves (``docs/metrics.md``) and the chart's RBAC rules (the chart's README).
Each table sits in its page between two markers; tests fail when a page's table differs from
what the code makes.

    python -m tests.support.write_reference_docs     # rewrite the tables after a change
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from prometheus_client.parser import text_string_to_metric_families
from pydantic_core import PydanticUndefined

from elasticjob.env_values import Flag, Seconds, seconds_text
from elasticjob.library_env import WORKER_DEFAULTS
from elasticjob.operator.controller import JobController
from elasticjob.operator.metrics import OperatorMetrics
from elasticjob.rendezvous.stats import RequestStats
from elasticjob.worker_contract import DEFAULT_TO_HOST, WorkerConfig, variable_of
from tests.support.metrics_stubs import StubController, snapshot

REPO: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO / "deploy" / "helm" / "elasticjob-operator"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ServedMetric:
    """A metric as ``/metrics`` serves it."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    samples: frozenset[str]


def served_metrics() -> list[ServedMetric]:
    """Every metric the operator serves while it runs a job that recovered once."""
    stats = RequestStats()
    stats.record("GET /v1/jobs/{job}/round", 200, 0.01)
    controllers = [StubController("ns.job", job=snapshot())]
    metrics = OperatorMetrics(lambda: cast(list[JobController], controllers), lambda: stats)
    observer = metrics.job_observer("ns.job")
    for observe in (observer.recovered, observer.round_formed, observer.committed):
        observe(1.0)
    observer.checkpointed(1.0)
    observer.health_checked(1.0, passed=True)
    metrics.set_leading(True)
    served = []
    families = list(text_string_to_metric_families(metrics.render().decode()))
    names = {family.name for family in families}
    for family in families:
        if family.name.removesuffix("_created") in names - {family.name}:
            continue  # when a counter's or histogram's series began, not a metric of its own
        samples = {s.name for s in family.samples}
        labels = dict.fromkeys(k for s in family.samples for k in s.labels if k != "le")
        name = f"{family.name}_total" if family.type == "counter" else family.name
        served.append(
            ServedMetric(name, family.type, tuple(labels), family.documentation, frozenset(samples))
        )
    return served


def metrics_table() -> str:
    rows = [
        f"| `{m.name}` | {m.kind} | {', '.join(f'`{label}`' for label in m.labels)} | {m.help} |"
        for m in sorted(served_metrics(), key=lambda m: m.name)
    ]
    return "\n".join(["| metric | type | labels | meaning |", "| --- | --- | --- | --- |", *rows])


def _default(name: str, field: Any) -> str:
    if name in DEFAULT_TO_HOST:
        return "the host name"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "unset"
    variable = variable_of(field)
    if isinstance(variable, Flag):
        return "`1`" if field.default else "`0`"
    if isinstance(variable, Seconds):
        return f"`{seconds_text(field.default)}`"
    return f"`{field.default}`"


def env_table() -> str:
    rows = []
    for name, field in WorkerConfig.model_fields.items():
        variables = ", ".join(f"`{v}`" for v in variable_of(field).names)
        meaning = " ".join((field.description or "").split())
        rows.append(f"| {variables} | {_default(name, field)} | {meaning} |")
    return "\n".join(["| variable | default | meaning |", "| --- | --- | --- |", *rows])


def worker_defaults_table() -> str:
    rows = [f"| `{d.variable}` | `{d.value}` | {d.meaning} |" for d in WORKER_DEFAULTS]
    return "\n".join(["| variable | value | meaning |", "| --- | --- | --- |", *rows])


def _rules(objects: Iterable[Manifest]) -> dict[tuple[str, str, str], set[str]]:
    """(role, resource, names) -> verbs, over the rendered Roles and ClusterRoles."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for role in objects:
        if role["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in role.get("rules") or []:
            names = ", ".join(f"`{n}`" for n in rule.get("resourceNames") or [])
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    what = f"`{resource}`" + (f" (`{group}`)" if group else "")
                    key = (f"{role['kind']} `{role['metadata']['name']}`", what, names)
                    found.setdefault(key, set()).update(rule["verbs"])
    return found


RELEASE: Final = "ej"
"""The release the RBAC table is rendered for (its objects' names read ``<name>``)."""
RELEASE_NAMESPACE: Final = "elasticjob-system"
"""The namespace it is rendered in (it reads ``<namespace>``)."""


def rbac_table(template: Callable[[Mapping[str, Any]], list[Manifest]]) -> str:
    """The rules of the chart with its defaults: ``template`` renders the chart (release
    :data:`RELEASE` in :data:`RELEASE_NAMESPACE`) with the values given; rules only there with
    the webhook on are marked so. The release's names read ``<name>`` and ``<namespace>``."""
    default = _rules(template({}))
    without_webhook = _rules(template({"webhook": {"enabled": False}}))
    rows = []
    for (role, resource, names), verbs in sorted(default.items()):
        only = "" if (role, resource, names) in without_webhook else " (with the webhook)"
        ordered = ", ".join(sorted(verbs))
        rows.append(f"| {role}{only} | {resource} | {ordered} | {names or 'any'} |")
    head = ["| role | resource | verbs | names |", "| --- | --- | --- | --- |"]
    table = "\n".join([*head, *rows])
    table = table.replace(f"{RELEASE}-elasticjob-operator", "<name>")
    return table.replace(RELEASE_NAMESPACE, "<namespace>")


def marked(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- reference:{name} begin[^>]*-->\n)(.*?)(\n<!-- reference:{name} end -->)", re.S
    )


def table_in(page: Path, name: str) -> str:
    """The table between the page's markers of ``name``."""
    found = marked(name).search(page.read_text())
    assert found is not None, f"{page} has no reference:{name} markers"
    return found.group(2).strip("\n")


def write_table(page: Path, name: str, table: str) -> None:
    text = page.read_text()
    new, count = marked(name).subn(lambda m: f"{m.group(1)}\n{table}\n{m.group(3)}", text)
    assert count == 1, f"{page}: {count} reference:{name} blocks"
    page.write_text(new)


TABLES: Final[Mapping[str, tuple[Path, Callable[[], str]]]] = {
    "worker-env": (REPO / "docs" / "worker-runtime.md", env_table),
    "worker-defaults": (REPO / "docs" / "worker-runtime.md", worker_defaults_table),
    "metrics": (REPO / "docs" / "metrics.md", metrics_table),
}
"""The tables made without tools, by marker name: their page and their maker."""
