"""A bounded run of the rendezvous fuzz campaign (``bench/fuzz_rendezvous.py``): hostile
requests of every class get 4xx (or a retry-later 503), change no job's state, leak nothing
across jobs, and the service's memory stays bounded while valid traffic is served."""

from __future__ import annotations

from bench.fuzz_rendezvous import run_campaign

RSS_GROWTH_BOUND_KIB = 20 * 1024
"""Whole process (service and clients, 30 long-poll connections among them)."""
SECOND_PASS_GROWTH_BOUND_KIB = 2 * 1024
"""A second pass of the same hostile requests: rejected requests leave nothing behind."""


async def test_bounded_fuzz_campaign() -> None:
    report = await run_campaign(requests=440, slow_clients=3, live_polls=30)
    assert report.requests >= 400
    assert report.server_errors == 0, report.by_kind
    assert report.state_changes == []
    assert report.cross_job_leaks == 0
    assert report.accepted_hostile == []
    hostile = {kind: statuses for kind, statuses in report.by_kind.items() if "flood" not in kind}
    # Refused with a 4xx, or (an unknown worker asking for a round: its pod may have started
    # before the driver planned it) told to retry later, keeping nothing of it.
    assert all(
        400 <= status < 500 or (kind == "unknown worker" and status == 503)
        for kind, statuses in hostile.items()
        for status in statuses
    ), report.by_kind
    assert report.retry_later == report.by_kind["unknown worker"][503]
    assert report.by_kind["flood over the rate"][429] > 0
    assert report.valid_requests > 0 and report.valid_failures == 0
    assert report.long_polls_held_max >= 30
    assert report.long_polls_refused == 20, "job-flood holds its bound of 20 and no more"
    assert report.slow_clients_cut_within_bound == report.slow_clients == 3
    assert report.rss_after_kib - report.rss_before_kib < RSS_GROWTH_BOUND_KIB
    first, second = report.rss_after_pass_kib
    assert second - first < SECOND_PASS_GROWTH_BOUND_KIB
