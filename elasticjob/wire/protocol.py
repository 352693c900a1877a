"""The rendezvous protocol's constants: its path prefix, its version and the header that
carries it, and the bounds of its messages (see :mod:`elasticjob.wire.messages`)."""

from __future__ import annotations

from typing import Final

API_PREFIX = "/v1"
"""Path prefix of every job-scoped endpoint of the rendezvous service."""

PROTOCOL_HEADER: Final = "X-Elasticjob-Protocol"
"""Header carrying the rendezvous protocol version: workers send theirs on every request and
the service answers with its own."""
PROTOCOL_VERSION: Final = 9
"""The rendezvous protocol this release speaks. Version 1 is that of the releases that sent no
:data:`PROTOCOL_HEADER` (a request without it is version 1). Version 2 added the header,
``429 Too Many Requests`` answers (a version-1 worker takes them as fatal), refusals of
workers the driver did not launch and of rounds not published yet, and strict bodies.
Version 3 added peer probes: :attr:`RendezvousResponse.peers` and the probe report of a
:class:`HeartbeatRequest`. Its request fields are optional, so a version-2 worker's requests
are valid version-3 requests; but a version-2 worker refuses any response field it does not
know (strict models), so the service leaves ``peers`` out of its answers to version 2.
``GET plan`` (:class:`PlannedRound`) came later without a new version: no older worker asks
for it, and a newer worker takes an older service's 404 as "no plan". Version 4 added the
optional :attr:`ProgressRequest.resumed` and :attr:`ProgressRequest.commit_seconds` (the
driver's recovery and commit metrics); a version-3 worker's reports stay valid. Version 5 added
the optional :attr:`ProgressRequest.checkpoints`, :attr:`ProgressRequest.restored_from`
and :attr:`ProgressRequest.committed_step` (durable checkpoints written and loaded, and the
committed steps a fallback loses); older workers' reports stay valid. Version 6 added the
optional :attr:`RendezvousRequest.probe_port` and :attr:`PeerEndpoint.probe_port`: peers are
probed on a listener of their own, not on their TCPStore server (the service leaves
``probe_port`` out of the peers it gives an older worker, which would refuse it). Version 7
added the optional :attr:`RendezvousRequest.script_exit` of restart-mode workers; older
workers' requests stay valid. Version 8 added the ``SUSPEND`` notice (the service leaves it
out of the notices it gives an older worker, which would refuse the kind: such a worker does
not stop for a suspension, and the driver stops it after the suspension's timeout) and the
optional :attr:`HeartbeatRequest.pace` (older workers report no pace: they are never found
to be stragglers). Version 9 added the health check of new pods (``POST health/cohort`` and
``POST health/report``, :mod:`elasticjob.wire.health`), which only the check of a pod of a job
with ``spec.healthCheck`` calls: nothing older workers send or get changed.
(The messages are those of :mod:`elasticjob.wire.messages`.)"""
SUSPEND_NOTICE_VERSION: Final = 8
"""The first protocol whose workers are given ``SUSPEND`` notices."""
MIN_PROTOCOL_VERSION: Final = 2
"""The oldest worker protocol this service accepts; an older (or newer) worker is refused
with ``426 Upgrade Required`` naming both versions, and exits with that message. Version-2
workers still train; they send no probe reports (see :data:`PROTOCOL_VERSION`)."""

MAX_PROBE_TARGETS: Final = 3
"""Most peers one worker probes in a round: rank 0 and its two neighbours in the ring of its
local rank across hosts (see ``elasticjob.rendezvous.probes``)."""

MAX_REPORTED_COMMITS: Final = 64
"""Most commit durations one progress report carries (the newest ones)."""

MAX_REPORTED_CHECKPOINTS: Final = 16
"""Most checkpoint reports one progress report carries (the newest ones)."""
