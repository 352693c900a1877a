"""A listener of a job's health checks as the tests use it."""

from __future__ import annotations

import asyncio

from elasticjob.rendezvous.health_checks import HealthChecks
from elasticjob.wire.health import HealthFigures, HealthVerdict, VerdictStatus


class RecordedVerdicts:
    """Records every final verdict the checks push (each once), and sets :attr:`changed`;
    admits a pod that passed at once once given its :attr:`checks` (as the operator does
    once it labelled the pod)."""

    def __init__(self) -> None:
        self.heard: dict[str, tuple[HealthVerdict, float | None, HealthFigures | None]] = {}
        self.changed = asyncio.Event()
        self.checks: HealthChecks | None = None

    def on_health_verdict(
        self,
        host: str,
        verdict: HealthVerdict,
        seconds: float | None,
        figures: HealthFigures | None,
    ) -> None:
        assert host not in self.heard, "a final verdict is told once"
        self.heard[host] = (verdict, seconds, figures)
        self.changed.set()
        if verdict.status is VerdictStatus.PASSED and self.checks is not None:
            self.checks.admitted(host)

    def outcomes(self) -> dict[str, tuple[VerdictStatus, float | None]]:
        """Every pod's verdict and the seconds its check took (None: it never reported)."""
        return {
            host: (verdict.status, seconds) for host, (verdict, seconds, _) in self.heard.items()
        }
