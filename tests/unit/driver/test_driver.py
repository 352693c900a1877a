"""The elastic driver, step by step: a fake launcher (records starts and stops, lets the test
end processes), the real in-memory rendezvous (workers are played by rendezvous requests)
and a fake clock. No real time passes: the test runs discovery and loop steps itself."""

from __future__ import annotations

import asyncio
import threading

import pytest

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import EventKind
from elasticjob.driver.worker_record import NOT_JOINED_HINT
from elasticjob.wire.messages import (
    HeartbeatRequest,
    HeldShards,
    NoticeKind,
    ProgressRequest,
    RendezvousRequest,
    RendezvousStatus,
    ResultRequest,
    ScriptExit,
    WorkerId,
    WorkerState,
)
from tests.support.driver_job import (
    A0,
    A1,
    B0,
    C0,
    DEADLINE,
    Job,
    RecordingObserver,
    bounded,
    settings,
)


@pytest.mark.parametrize("blocks", [True, False])
async def test_a_discovery_that_may_block_runs_in_a_thread_and_one_that_reads_memory_does_not(
    blocks: bool,
) -> None:
    job = Job({"a": 1}, settings())
    job.discovery.blocks = blocks
    await job.discover()
    assert job.hosts.current_hosts == (("a", 1),)
    assert (job.discovery.threads == [threading.get_ident()]) is not blocks


async def test_first_round_waits_for_every_worker_then_syncs() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0] and job.driver.phase is DriverPhase.STARTING
    # Each process starts knowing its planned place, as horovodrun's do.
    assert {w: (s.rank, s.size) for w, s in job.launcher.planned.items()} == {
        A0: (0, 2),
        B0: (1, 2),
    }
    await job.ask(A0)
    await job.step()
    assert job.driver.round == 0, "b[0] has not registered"
    await job.ask(B0)
    await job.step()
    answer = await job.ask(A0)
    assert (answer.status, answer.round, answer.sync) == (RendezvousStatus.ASSIGNED, 1, True)
    assert job.driver.rank_of(A0) == 0 and job.driver.rank_of(B0) == 1


async def test_failure_during_formation_forms_the_round_without_the_failed_host() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.discover()
    await job.step()
    await job.ask(A0)
    job.launcher.end(B0, 1)  # fails before it ever registered
    await job.step()
    assert "b" in job.hosts.blacklist
    assert job.driver.round == 1 and list(job.driver.slots) == [A0]
    assert (await job.notices()) == [], "no round was running: nobody to tell"


async def test_member_failure_is_told_at_once_and_the_next_round_syncs() -> None:
    job = Job({"a": 1, "b": 1, "c": 1}, settings())
    await job.start_round_1(A0, B0, C0)
    job.launcher.end(B0, 137)
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("b",))]
    assert job.driver.snapshot().recovering
    assert "b" in job.hosts.blacklist, "struck at its failure, as under the operator"
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 1, "c[0] has not reported yet"
    await job.ask(C0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0]
    assert (await job.ask(C0, 1)).sync is True
    assert "b" in job.hosts.blacklist and job.driver.registry.reset_count == 1
    assert not job.driver.snapshot().recovering


async def test_time_to_recover_runs_from_the_failure_to_the_next_rounds_first_report() -> None:
    """Round formation, commits and the time to recover reach the observer; lost time is
    accounted per cause; a late report of the failed round ends nothing."""
    job = Job({"a": 1, "b": 1, "c": 1}, settings())
    observer = job.driver.journal.observer = RecordingObserver()
    job.clock.now += 1.0
    await job.start_round_1(A0, B0, C0)

    def report(
        round_number: int, *, resumed: bool = False, commit_seconds: tuple[float, ...] = ()
    ) -> None:
        job.job.report_progress(
            ProgressRequest(
                round=round_number, epoch=0, step=1, resumed=resumed, commit_seconds=commit_seconds
            )
        )

    job.clock.now += 1.0
    report(1, resumed=True)
    job.clock.now += 3.0
    report(1, commit_seconds=(0.25, 0.5))
    job.clock.now += 5.0
    job.launcher.end(B0, 137)
    job.clock.now += 1.0
    await job.ask(A0, 1)
    await job.ask(C0, 1)
    await job.step()
    assert job.driver.round == 2
    job.clock.now += 0.5
    report(1)
    assert observer.recoveries == [], "a late report of the failed round"
    job.clock.now += 1.5
    report(2, resumed=True)
    assert observer.formed == pytest.approx([1.0, 1.0])
    assert observer.commits == [0.25, 0.5]
    assert observer.recoveries == pytest.approx([3.0])
    assert job.driver.journal.lost_time.last_recovery_s == pytest.approx(3.0)
    lost = job.driver.journal.lost_time.lost_seconds(job.clock.now)
    assert dict(lost) == pytest.approx(
        {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 5.0, LostTo.RECOVERY: 3.0, LostTo.RESIZE: 0.0}
    )
    record = job.driver.journal.record.data({}, 1.0)
    assert [(e.kind, e.round, e.world_size) for e in record.events] == [
        (EventKind.ROUND, 1, 3),
        (EventKind.RESUMED, 1, 3),
        (EventKind.FAILURE, 1, 3),
        (EventKind.BLACKLISTED, 1, 0),
        (EventKind.ROUND, 2, 2),
        (EventKind.RESUMED, 2, 2),
    ]
    first, again = (e for e in record.events if e.kind is EventKind.RESUMED)
    assert first.rolled_back_from is None, "the startup threw no training away"
    assert again.rolled_back_from is not None
    assert again.t - again.rolled_back_from == pytest.approx(8.0), "from the last commit"
    assert [s.world_size for s in record.samples][-1] == 2


@pytest.mark.parametrize("rolled_back", [True, False])
async def test_one_sided_rollback_fails_the_round_and_syncs_the_next(rolled_back: bool) -> None:
    """A member that rolled back after a collective failed on it alone (no process ended)
    makes the driver fail the round at once and sync the next one; the same re-formation
    without a rollback (every member came to the barrier with live state) does not sync."""
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    await job.ask(B0, 1, rolled_back=rolled_back)
    assert (await job.notices()) == ([(NoticeKind.ROUND_FAILED, ("b",))] if rolled_back else [])
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2
    assert (await job.ask(A0, 1)).sync is rolled_back
    assert not job.hosts.blacklist.active(), "a rollback blacklists nobody"
    assert job.driver.registry.reset_count == 1
    if rolled_back:
        assert "rolled back" in (job.driver.last_reset_reason or "")


async def test_scale_out_while_a_failure_is_pending_launches_but_does_not_announce() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)
    job.discovery.hosts["c"] = 1
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0, C0], "the failed b[0] is not started again"
    await job.ask(C0)
    await job.step()
    assert [kind for kind, _ in (await job.notices())] == [NoticeKind.ROUND_FAILED]
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0]
    assert (await job.ask(C0)).sync is True


async def test_scale_out_announces_newcomers_once_registered() -> None:
    job = Job({"a": 1}, settings())
    await job.start_round_1(A0)
    job.discovery.hosts["b"] = 2
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0, WorkerId("b", 1)]
    # The newcomers can read the round planned with them (their tentative place at init()),
    # and were started knowing it.
    plan = job.driver.rendezvous.planned_round()
    assert plan.round == 2
    newcomers = {w: job.launcher.planned[w] for w in (B0, WorkerId("b", 1))}
    assert [(s.rank, s.size, s.local_rank, s.cross_rank) for s in newcomers.values()] == [
        (1, 3, 0, 1),
        (2, 3, 1, 0),
    ]
    assert [(s.hostname, s.local_rank, s.rank, s.size) for s in plan.slots] == [
        ("a", 0, 0, 3),
        ("b", 0, 1, 3),
        ("b", 1, 2, 3),
    ]
    await job.ask(B0)
    await job.step()
    assert (await job.notices()) == [], "b[1] has not registered"
    await job.ask(WorkerId("b", 1))
    await job.step()
    await job.step()
    assert (await job.notices()) == [(NoticeKind.HOSTS_ADDED, ("b",))], "announced once"
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and len(job.driver.slots) == 3
    assert (await job.ask(A0, 1)).sync is True
    assert job.driver.rendezvous.planned_round().slots == (), "published: nothing planned"


async def test_a_sharded_states_newcomer_is_placed_where_the_fewest_rows_move() -> None:
    """The members say, asking for the round after the scale-out, which shards of a
    one-dimensional sharded state they hold: the newcomer goes between them (each then
    keeps two thirds of its new shard), not last (the second would keep one third)."""
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.discovery.hosts["c"] = 1
    await job.discover()
    await job.step()
    await job.ask(C0)
    await job.step()
    assert (await job.notices()) == [(NoticeKind.HOSTS_ADDED, ("c",))]
    await job.ask(A0, 1, held_shards=HeldShards(shards=2, own=0))
    await job.ask(B0, 1, held_shards=HeldShards(shards=2, own=1))
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0, B0]
    assert [job.driver.rank_of(w) for w in (A0, C0, B0)] == [0, 1, 2]


async def test_blacklisted_host_rejoins_after_its_cooldown() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0]
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0], "b is cooling down (10 s)"
    job.clock.now += 10.5
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0, B0]
    await job.ask(B0)
    await job.step()
    assert (await job.notices())[-1] == (NoticeKind.HOSTS_ADDED, ("b",))
    await job.ask(A0, 2)
    await job.step()
    assert job.driver.round == 3 and list(job.driver.slots) == [A0, B0]


async def test_a_replacement_started_while_recovering_can_read_its_planned_place() -> None:
    job = Job({"a": 1, "b": 1, "c": 1}, settings(max_np=2))
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.launcher.started == [A0, B0, C0] and job.driver.round == 1
    plan = job.driver.rendezvous.planned_round()
    assert [(s.hostname, s.rank, s.size) for s in plan.slots] == [("a", 0, 2), ("c", 1, 2)]
    assert plan.round == 2
    await job.ask(C0)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0]
    assert job.driver.rendezvous.planned_round().slots == ()


async def test_reset_limit_ends_the_job() -> None:
    job = Job({"a": 1, "b": 1, "c": 1}, settings(reset_limit=1))
    await job.start_round_1(A0, B0, C0)
    job.launcher.end(C0, 1)
    await job.ask(A0, 1)
    await job.ask(B0, 1)
    await job.step()
    assert job.driver.round == 2
    job.launcher.end(B0, 1)
    await job.ask(A0, 2)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert "reset limit 1 exceeded" in job.driver.result.message


async def test_restarts_before_a_driver_restart_count_toward_the_restart_limit() -> None:
    """Restart mode after an operator restart: the recorded restarts (failures only) are
    carried on; one more failure past ``restart_limit`` ends the job."""
    job = Job({"a": 1, "b": 1}, settings(restart_limit=2))
    job.driver.resume_resets(3, 2, "reset 3: b failed")
    await job.start_round_1(A0, B0)
    job.driver.resume_resets(3, 1, "older")
    assert job.driver.registry.restart_count == 2, "a recorded count never lowers the count"
    assert job.driver.snapshot().restart_count == 2
    job.launcher.end(B0, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert "restart limit 2 exceeded" in job.driver.result.message


async def test_resets_before_a_driver_restart_count_toward_the_limit() -> None:
    """A restarted driver carries on the recorded reset count (it never goes back): one
    more failure past ``reset_limit`` ends the job."""
    job = Job({"a": 1, "b": 1}, settings(reset_limit=2))
    job.driver.resume_resets(2, 0, "reset 2: b failed")
    await job.start_round_1(A0, B0)
    assert job.driver.registry.reset_count == 2
    assert job.driver.last_reset_reason == "reset 2: b failed"
    job.driver.resume_resets(1, 0, "older")
    assert job.driver.registry.reset_count == 2, "a recorded count never lowers the count"
    job.launcher.end(B0, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert "reset limit 2 exceeded" in job.driver.result.message


async def test_elastic_timeout_ends_the_job() -> None:
    job = Job({"a": 1, "b": 1}, settings(min_np=2, elastic_timeout_s=30.0))
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.phase is DriverPhase.FORMING and job.driver.result is None
    job.clock.now += 29.0
    await job.step()
    assert job.driver.result is None, "still within the elastic timeout"
    job.clock.now += 1.0
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert "elastic timeout" in job.driver.result.message
    assert "min_np" in job.driver.result.message


async def test_active_deadline_ends_the_job_counting_the_time_run_under_earlier_drivers() -> None:
    """The deadline counts the job's running time, an earlier driver's included (an operator
    restart, a resumed suspension): here 60 s before this driver started."""
    job = Job({"a": 1, "b": 1}, settings(active_deadline_s=100.0))
    job.driver.resume_account(None, {}, 60.0)
    await job.start_round_1(A0, B0)
    job.clock.now += 99.0 - job.driver.journal.running_seconds()
    await job.step()
    assert job.driver.result is None, "99 s run: within the deadline"
    job.clock.now += 1.0
    await job.step()
    result = job.driver.result
    assert result is not None and not result.success and result.deadline_exceeded, result
    assert "past its active deadline of 100 s" in result.message
    assert job.driver.journal.record.events[-1].kind is EventKind.FINISHED


async def test_a_worker_of_another_release_fails_the_job_with_the_services_message() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.driver.on_incompatible_worker("the worker speaks rendezvous protocol 0, this ...")
    await job.step()
    result = job.driver.result
    assert result is not None and not result.success, result
    assert "an image of another elasticjob release: the worker speaks rendezvous protocol 0" in (
        result.message
    )


async def test_every_discovered_host_blacklisted_ends_the_job() -> None:
    job = Job({"a": 2}, settings())
    await job.start_round_1(A0, A1)
    job.launcher.end(A1, 1)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert "every discovered host is blacklisted" in job.driver.result.message


async def test_graceful_scale_in_dismisses_without_rollback_or_blacklisting() -> None:
    job = Job({"a": 1, "b": 1}, settings(removal_grace_s=30.0))
    await job.start_round_1(A0, B0)
    del job.discovery.hosts["b"]
    await job.discover()
    assert (await job.notices()) == [(NoticeKind.HOSTS_REMOVED, ("b",))]
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2, "the leaving b[0] is not waited for"
    assert list(job.driver.slots) == [A0]
    assert (await job.ask(A0, 1)).sync is False, "live state is kept: no rollback, no sync"
    assert (await job.ask(B0, 1)).status is RendezvousStatus.REMOVED
    assert job.driver.rank_of(B0) is None
    assert not job.hosts.blacklist.active()
    assert [kind for kind, _ in (await job.notices())] == [NoticeKind.HOSTS_REMOVED]
    job.clock.now += 30.0
    await job.step()
    assert job.launcher.stopped == [B0], "a dismissed worker still running after the grace"
    job.launcher.end(B0, 0)
    await job.step()
    assert job.driver.result is None and job.driver.journal.lost_time.last_recovery_s is None


async def test_a_host_back_before_its_dismissed_worker_exited_gets_a_fresh_process() -> None:
    """b is removed (its worker dismissed), then discovered again while that worker is still
    exiting: the next round waits for the exit and takes a fresh process, never the exiting
    one (whose exit 0 would otherwise count as the job's success)."""
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    del job.discovery.hosts["b"]
    await job.discover()
    await job.ask(B0, 1)  # the leaving worker comes to the barrier too
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0]
    assert (await job.ask(B0, 1)).status is RendezvousStatus.REMOVED
    job.discovery.hosts["b"] = 1
    await job.discover()
    await job.step()
    await job.ask(A0, 2)
    await job.step()
    assert job.driver.round == 2, "b[0]'s dismissed process is not a member-to-be"
    assert job.launcher.started.count(B0) == 1
    job.launcher.end(B0, 0)
    await job.step()
    assert job.launcher.started.count(B0) == 2, "a fresh process for b"
    assert job.driver.result is None, "the dismissed worker's exit 0 is no success"
    await job.ask(B0)
    await job.step()
    assert job.driver.round == 3 and set(job.driver.slots) == {A0, B0}


async def test_leaving_member_that_leaves_at_the_barrier_is_not_a_failure() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    del job.discovery.hosts["b"]
    await job.discover()
    await job.ask(B0, 1)  # it stopped with the others at their agreed check
    job.launcher.end(B0, 143)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0]
    assert [kind for kind, _ in (await job.notices())] == [NoticeKind.HOSTS_REMOVED]
    assert not job.hosts.blacklist.active()


async def test_leaving_member_that_ends_before_its_release_fails_the_round_not_its_host() -> None:
    """Its grace ran out before the round's next check (a pod deleted with a short grace
    period): the others wait for it in their collectives, so the round fails; its host is
    not to blame."""
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    del job.discovery.hosts["b"]
    await job.discover()
    job.launcher.end(B0, 137)
    await job.step()
    assert [kind for kind, _ in (await job.notices())] == [
        NoticeKind.HOSTS_REMOVED,
        NoticeKind.ROUND_FAILED,
    ]
    await job.ask(A0, 1, rolled_back=True)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0]
    assert not job.hosts.blacklist.active()


async def test_slow_starter_that_never_registers_is_stopped_and_blacklisted() -> None:
    job = Job({"a": 1, "b": 1}, settings(start_timeout_s=60.0))
    await job.discover()
    await job.step()
    await job.ask(A0)
    job.clock.now += 60.0
    await job.step()
    assert job.launcher.stopped == [] and job.driver.round == 0
    job.clock.now += 1.0
    await job.step()
    assert job.launcher.stopped == [B0]
    assert "b" in job.hosts.blacklist
    await job.step()
    assert job.driver.round == 1 and list(job.driver.slots) == [A0]
    job.launcher.end(B0, -15)
    await job.step()
    assert job.launcher.stopped == [B0] and job.hosts.blacklist.strikes("b") == 1


async def test_worker_that_cannot_be_started_counts_as_failed() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    job.launcher.start_fails.add(B0)
    await job.discover()
    await job.step()
    assert "b" in job.hosts.blacklist
    await job.ask(A0)
    await job.step()
    assert job.driver.round == 1 and list(job.driver.slots) == [A0]


async def test_success_of_a_member_ends_the_job() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.launcher.end(A0, 0)
    await job.step()
    assert job.driver.result is None, "b[0] has not reported yet"
    job.launcher.end(B0, 0)
    await job.step()
    assert job.driver.result is not None and job.driver.result.success
    assert (job.driver.result.rounds, job.driver.result.resets) == (1, 0)


def report(job: Job, worker: WorkerId, state: WorkerState) -> None:
    """The worker's runtime beats, then reports how its process ends (its script returned or
    raised); it beats no more (its interpreter exits)."""
    job.job.report_heartbeat(
        HeartbeatRequest(hostname=worker.hostname, local_rank=worker.local_rank)
    )
    failure = ScriptExit(exit_code=1) if state is WorkerState.FAILURE else None
    job.job.report_result(
        ResultRequest(
            hostname=worker.hostname, local_rank=worker.local_rank, state=state, script_exit=failure
        )
    )


async def test_a_member_still_beating_after_its_success_is_not_stopped() -> None:
    """Work after the training loop (an evaluation, a save) beats: never cut short."""
    job = Job({"a": 1}, settings(removal_grace_s=30.0, heartbeat_timeout_s=5.0))
    await job.start_round_1(A0)
    report(job, A0, WorkerState.SUCCESS)
    for _ in range(10):
        job.clock.now += 20.0
        job.job.report_heartbeat(HeartbeatRequest(hostname="a", local_rank=0))
        await job.step()
    assert job.launcher.stopped == [] and job.driver.result is None
    job.launcher.end(A0, 0)
    await job.step()
    assert job.driver.result is not None and job.driver.result.success


async def test_a_member_hung_in_teardown_after_its_success_is_stopped_and_counts_as_success() -> (
    None
):
    """Every member reported SUCCESS; b[0] never exits (a communicator's shutdown hangs).
    After the removal grace the driver stops it, and the job succeeds: its training ended."""
    job = Job({"a": 1, "b": 1}, settings(removal_grace_s=30.0, heartbeat_timeout_s=5.0))
    await job.start_round_1(A0, B0)
    report(job, A0, WorkerState.SUCCESS)
    report(job, B0, WorkerState.SUCCESS)
    job.launcher.end(A0, 0)
    job.clock.now += 29.0
    await job.step()
    assert job.launcher.stopped == [] and job.driver.result is None, "within the grace"
    job.clock.now += 1.0
    await job.step()
    assert job.launcher.stopped == [B0]
    await job.step()
    assert job.launcher.stopped == [B0], "stopped once"
    # Under the operator the stop deletes b[0]'s pod: its host vanishes before its exit.
    del job.discovery.hosts["b"]
    await job.discover()
    assert (await job.notices()) == [], "a member that reported its end is not leaving"
    job.launcher.end(B0, 137)
    await job.step()
    assert job.driver.result is not None and job.driver.result.success
    assert not job.hosts.blacklist.active()


async def test_a_lone_member_hung_in_teardown_after_its_success_ends_the_job_with_success() -> None:
    job = Job({"a": 1}, settings(removal_grace_s=30.0, heartbeat_timeout_s=5.0))
    await job.start_round_1(A0)
    report(job, A0, WorkerState.SUCCESS)
    job.clock.now += 30.0
    await job.step()
    assert job.launcher.stopped == [A0]
    job.launcher.end(A0, -9)
    await job.step()
    assert job.driver.result is not None and job.driver.result.success


async def test_a_member_hung_in_teardown_after_its_failure_is_stopped_and_fails_the_round() -> None:
    """b[0]'s script raised and its process hangs: stopped after the grace, it fails the
    round (its host blacklisted) instead of holding every survivor forever."""
    job = Job({"a": 1, "b": 1}, settings(removal_grace_s=30.0, heartbeat_timeout_s=5.0))
    await job.start_round_1(A0, B0)
    report(job, B0, WorkerState.FAILURE)
    job.clock.now += 30.0
    await job.step()
    assert job.launcher.stopped == [B0]
    job.launcher.end(B0, -15)
    await job.step()
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("b",))]
    await job.ask(A0, 1, rolled_back=True)
    await job.step()
    assert list(job.hosts.blacklist.active()) == ["b"]
    assert job.driver.round == 2 and list(job.driver.slots) == [A0]


async def test_run_drives_the_job_to_its_end() -> None:
    """The whole loop, woken by events (not by its 1 s tick; hosts are pushed, not polled)."""
    job = Job({"a": 1}, settings())
    await job.discover()
    run = asyncio.create_task(job.driver.run())
    await bounded(job.launcher.changed.wait())
    request = RendezvousRequest(
        hostname="a", local_rank=0, address="127.0.0.1", store_port=29500, wait_seconds=DEADLINE
    )
    answer = await bounded(job.job.rendezvous(request))
    assert (answer.status, answer.round) == (RendezvousStatus.ASSIGNED, 1)
    job.launcher.end(A0, 0)
    result = await bounded(run)
    assert result.success and job.launcher.stopped_all
    assert job.job.finished


async def test_a_discovery_that_fails_on_its_first_run_fails_the_job_at_once() -> None:
    job = Job({"a": 1}, settings(elastic_timeout_s=600.0))
    job.discovery.error = "discovery script './hosts.sh' exited with status 2; stderr: no API"
    await job.discover()
    assert job.driver.result is not None and not job.driver.result.success
    assert job.driver.result.message == (
        "host discovery failed: discovery script './hosts.sh' exited with status 2; stderr: no API"
    )
    assert job.launcher.started == []


async def test_later_discovery_failures_are_retried_and_the_last_one_is_reported() -> None:
    job = Job({"a": 1}, settings(min_np=2, elastic_timeout_s=30.0))
    await job.discover()
    await job.step()
    assert job.driver.result is None and job.launcher.started == []
    job.discovery.error = "first failure"
    await job.discover()
    job.discovery.error = "second failure"
    await job.discover()
    assert job.driver.result is None, "retried: discovery has worked before"
    job.clock.now += 31.0
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    message = job.driver.result.message
    assert message.startswith("elastic timeout: 1 slots available"), message
    assert message.endswith("the last host discovery failed: second failure"), message


async def test_a_discovery_that_works_again_is_no_longer_reported() -> None:
    job = Job({"a": 1}, settings(min_np=2, elastic_timeout_s=30.0))
    await job.discover()
    job.discovery.error = "transient"
    await job.discover()
    job.discovery.error = None
    await job.discover()
    await job.step()
    job.clock.now += 31.0
    await job.step()
    assert job.driver.result is not None and "elastic timeout" in job.driver.result.message
    assert "discovery failed" not in job.driver.result.message


@pytest.mark.parametrize(
    ("exit_code", "says"),
    [
        (127, "a[0]: exited with status 127 (command not found) before it joined the job"),
        (126, "a[0]: exited with status 126 (command not executable) before it joined the job"),
        (3, f"a[0]: exited with status 3 before it joined the job ({NOT_JOINED_HINT})"),
    ],
)
async def test_workers_that_fail_before_any_round_say_how_in_the_final_message(
    exit_code: int, says: str
) -> None:
    """Not only 'every discovered host is blacklisted' (a wrapper script whose command is
    not found exits 127)."""
    job = Job({"a": 1}, settings())
    await job.discover()
    await job.step()
    job.launcher.end(A0, exit_code)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert job.driver.result.message == "every discovered host is blacklisted: ['a']\n" + says


async def test_a_worker_that_registered_and_failed_between_rounds_says_so() -> None:
    job = Job({"a": 1}, settings())
    await job.discover()
    await job.step()
    await job.ask(A0)
    job.launcher.end(A0, 3)
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert job.driver.result.message.endswith("a[0]: exited with status 3 outside a round")


@pytest.mark.parametrize("running", [False, True], ids=["first-worker", "newcomer"])
async def test_a_worker_that_exits_0_without_joining_fails_the_job_at_once(running: bool) -> None:
    """A command that never uses the worker runtime (``hostname``, a torchrun script that
    sets its own group up) is not restarted over and over: the job fails and says why."""
    job = Job({"a": 1}, settings(max_np=2))
    if running:
        await job.start_round_1(A0)
        job.discovery.hosts["b"] = 1
        await job.discover()
        await job.step()
        assert B0 in job.launcher.started
        worker = B0
    else:
        await job.discover()
        await job.step()
        worker = A0
    job.launcher.end(worker, 0)
    await job.step()
    assert job.launcher.started.count(worker) == 1, "not started again"
    assert job.driver.result is not None and not job.driver.result.success
    assert job.driver.result.message == (
        f"worker {worker} exited with status 0 before it joined the job: its command never "
        f"asked for a round, and a fresh process would do the same ({NOT_JOINED_HINT})"
    )


async def test_a_newcomer_that_ran_the_runtime_and_ended_does_not_fail_the_job() -> None:
    """A script without ``elastic.run`` under elastic flags: its newcomer called ``init()``
    (it beats) but never asks for a round; its exit 0 is no sign of a command that cannot
    join, so the members' job goes on."""
    job = Job({"a": 1}, settings(max_np=2))
    await job.start_round_1(A0)
    job.discovery.hosts["b"] = 1
    await job.discover()
    await job.step()
    assert B0 in job.launcher.started
    job.driver.on_worker_heartbeat(B0, None, None)
    job.launcher.end(B0, 0)
    await job.step()
    assert job.driver.result is None


async def test_a_restart_mode_script_failure_fails_the_round_as_no_rollback() -> None:
    """b[0]'s agent says its script exited 3 (``script_exit``, without ``rolled_back``): the
    round fails at once and the next one counts a restart; nothing rolled back, and the agent
    lives on, so nobody is blacklisted."""
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    await job.ask(B0, 1, script_exit=ScriptExit(exit_code=3, log_tail="boom"))
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("b",))]
    assert job.driver.registry.records().rolled_back == frozenset()
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and (await job.ask(A0, 1)).sync
    assert not job.hosts.blacklist.active()
    assert (job.driver.registry.reset_count, job.driver.registry.restart_count) == (1, 1)


async def test_a_script_that_failed_on_every_agent_fails_the_job_once() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    for worker in (B0, A0):
        await job.ask(worker, 1, script_exit=ScriptExit(exit_code=3, log_tail="ValueError: x"))
    await job.step()
    assert job.driver.result is not None and not job.driver.result.success
    assert job.driver.result.message.startswith(
        "the script failed on every worker: b[0] exit code 3, a[0] exit code 3"
    )
    assert job.driver.registry.restart_count == 0
