"""The rendezvous protocol's constants: its path prefix, its version and the header that
carries it, and the bounds of its messages (see :mod:`elasticjob.wire.messages`)."""

from __future__ import annotations

from typing import Final

API_PREFIX = "/v1"
"""Path prefix of every job-scoped endpoint of the rendezvous service."""

PROTOCOL_HEADER: Final = "X-Elasticjob-Protocol"
"""Header carrying the rendezvous protocol version: workers send theirs on every request and
the service answers with its own."""
PROTOCOL_VERSION: Final = 4
"""The rendezvous protocol this release speaks. Protocol 2 is protocol 1 (the first) with a
credential per worker: every request that changes state speaks for the host its bearer
credential names (``elasticjob.rendezvous.job_credentials``), and only rank 0's host reports
progress. Protocol 3 adds what a worker holds of a one-dimensional sharded state to its
request for a round (:class:`HeldShards`), which the driver places the round's ranks by, and
``POST exits``. Protocol 4 says whether the held shards are HSDP's, sends them with every
heartbeat too, and answers ``POST exits`` with what the pod does (:class:`ExitAnswer`: the
driver may keep the pod and have its slot restarted). Its routes under :data:`API_PREFIX`,
with their messages (:mod:`elasticjob.wire.messages` and :mod:`elasticjob.wire.health`):

- ``POST rendezvous``: a worker is ready for a round (:class:`RendezvousRequest`, with its
  store and probe listener ports, a rollback, a restart-mode script's exit, a suspension, the
  shards it holds) and gets one (:class:`RendezvousResponse`, with the peers it probes);
- ``GET notices``: the job's notices (hosts added or removed, a round failed, ``SUSPEND``);
- ``POST heartbeat``: a worker is alive (:class:`HeartbeatRequest`, with its probe report,
  its step pace and the shards it holds);
- ``POST progress``: rank 0's progress (:class:`ProgressRequest`, with its commit durations,
  durable checkpoints written or loaded, and its committed step);
- ``POST results``: how a worker's process ends (:class:`ResultRequest`);
- ``POST exits``: a pod's slot supervisor saw one of its slots' processes end
  (:class:`ExitReport`), and is told whether to restart it (:class:`ExitAnswer`);
- ``GET round`` and ``GET plan``: the round in force (:class:`RoundInfo`) and the round the
  driver plans with the workers it adds (:class:`PlannedRound`);
- ``POST health/cohort`` and ``POST health/report``: a new pod's health check.

Every request carries :data:`PROTOCOL_HEADER` with this version, and the service accepts
exactly its own version: a request of another version, or without the header, is refused with
``426 Upgrade Required`` naming both versions (the worker exits with that message), so a job's
workers run an image of the operator's release. Any change to the requests or the answers
(a route, a field, a value, a status) bumps this version."""

MAX_PROBE_TARGETS: Final = 3
"""Most peers one worker probes in a round: rank 0 and its two neighbours in the ring of its
local rank across hosts (see ``elasticjob.rendezvous.probes``)."""

MAX_REPORTED_COMMITS: Final = 64
"""Most commit durations one progress report carries (the newest ones)."""

MAX_HELD_COPIES: Final = 64
"""Most copies of other ranks' shards one worker says it holds (``HeldShards.copies``)."""

MAX_EXIT_REASON_CHARS: Final = 512
"""Most characters of the reason an answer to ``POST exits`` gives (``ExitAnswer.reason``)."""

MAX_REPORTED_CHECKPOINTS: Final = 16
"""Most checkpoint reports one progress report carries (the newest ones)."""
