"""Elastic scenarios with real processes: the launcher, the driver, the rendezvous service and
workers training over Gloo on loopback "hosts" (127.0.1.N).

Each scenario scripts hosts per epoch (a discovery schedule) and failures per (epoch, batch,
rank), then checks per epoch: world size, ranks and hosts, rounds; and at the end: identical
model state on every rank and exactly-once sample accounting in the committed trajectory.
A job whose every worker fails, or whose every host is blacklisted, fails as horovodrun's
does: ``test_horovodrun_scenarios.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.job_runs import (
    EPOCHS,
    HEARTBEAT_TIMEOUT_S,
    assert_trained_exactly_once,
    ranks_by_host,
    run_job,
    worker_args,
)

pytestmark = pytest.mark.integration


def test_scale_out_newcomers_get_state_from_rank_0_and_a_scale_in_keeps_live_state(
    tmp_path: Path,
) -> None:
    """Two hosts, then a third of two slots (epoch 1), then the third removed (epoch 2).
    Newcomers get rank 0's state and go last; the leavers leave gracefully; no one rolls back
    and no sample is lost. The script also makes a set of the even ranks at the top of its
    elastic function: every member (newcomers included) registers it in every round, and its
    reductions count the even ranks of the round they run in."""
    two = "127.0.1.1:1,127.0.1.2:1"
    run = run_job(
        tmp_path,
        launcher_args=["-np", "2", "--min-np", "2", "--max-np", "8"],
        worker_args=worker_args("--expect-sizes", "2,4,2", "--step-time", "0.02", "--process-set"),
        schedule={0: two, 1: f"{two},127.0.1.3:2", 2: two},
    )
    assert run.returncode == 0, run.explain()
    done = assert_trained_exactly_once(run)
    sums = run.of("set_sum")
    assert {(e["size"], e["members"]) for e in sums} == {(2, 1), (4, 2)}, sums
    assert {e["rank"] for e in sums if e["size"] == 4} == {0, 2}
    ends = run.epoch_ends()
    assert [ends[e][0]["size"] for e in range(EPOCHS)] == [2, 4, 2]
    # Survivors keep their order (rank 0 stays on the oldest host), newcomers go last.
    assert ranks_by_host(ends[1]) == {
        ("127.0.1.1", 0): 0,
        ("127.0.1.2", 0): 1,
        ("127.0.1.3", 0): 2,
        ("127.0.1.3", 1): 3,
    }
    assert ranks_by_host(done) == {("127.0.1.1", 0): 0, ("127.0.1.2", 0): 1}
    assert {d["round"] for d in done} == {3}
    assert "rolling back" not in run.stdout, "a hosts-updated reset must keep live state"
    assert "left the job (exit code 0)" in run.stderr, run.explain()
    assert "failed" not in run.stderr.replace("job failed", ""), run.explain()
    # Every survivor was interrupted at the same step (the agreed host-update check).
    last_steps = {
        (e["epoch"], e["batch"]) for e in run.of("step") if e["round"] == 1 and e["size"] == 2
    }
    survivors_last = {
        max((e["epoch"], e["batch"]) for e in run.of("step") if e["round"] == 1 and e["rank"] == r)
        for r in (0, 1)
    }
    assert len(survivors_last) == 1 and survivors_last <= last_steps


@pytest.mark.parametrize("mode", ["sigkill", "exception"])
def test_failed_worker_blacklists_its_host_and_survivors_roll_back(
    tmp_path: Path, mode: str
) -> None:
    run = run_job(
        tmp_path,
        launcher_args=["-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2"],
        worker_args=worker_args("--fail", f"1:3:3:{mode}", "--expect-sizes", "4,2,2"),
    )
    assert run.returncode == 0, run.explain()
    done = assert_trained_exactly_once(run)
    assert ranks_by_host(done) == {("127.0.1.1", 0): 0, ("127.0.1.1", 1): 1}
    assert "blacklisted host 127.0.1.2" in run.stderr
    assert "rolling back to the last commit" in run.stdout
    # Both survivors rolled back to the same commit: round 2 has nothing to sync.
    assert "state already in sync: every rank rolled back to the same commit" in run.stdout
    assert not re.search(r"round=2 rank=\d step=\d+\] state synced", run.stdout), run.explain()
    # The failed worker's host-mate was removed, not failed.
    assert "worker 127.0.1.2[0] left the job (exit code 0)" in run.stderr, run.explain()
    assert "job succeeded after 2 rounds and 1 resets" in run.stderr
    # Survivors learn of the failure from the driver, not from a collective timeout (60 s).
    failed_at = run.of("fail")[0]["time"]
    resumed_at = min(e["time"] for e in run.of("reset") if e["round"] == 2)
    assert resumed_at - failed_at < 15, f"survivors took {resumed_at - failed_at:.1f} s to resume"


def test_frozen_worker_is_evicted_and_survivors_re_form_within_10_s(tmp_path: Path) -> None:
    run = run_job(
        tmp_path,
        launcher_args=[
            *("-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2"),
            *("--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)),
        ],
        worker_args=worker_args("--fail", "1:3:3:sigstop", "--expect-sizes", "4,2,2"),
        timeout_s=150,
    )
    assert run.returncode == 0, run.explain()
    done = assert_trained_exactly_once(run)
    assert ranks_by_host(done) == {("127.0.1.1", 0): 0, ("127.0.1.1", 1): 1}
    assert "worker 127.0.1.2[1] sent no heartbeat" in run.stderr, run.explain()
    assert "worker 127.0.1.2[1] of round 1 failed (exit code -9)" in run.stderr, run.explain()
    assert "blacklisted host 127.0.1.2" in run.stderr
    assert "worker 127.0.1.2[0] left the job (exit code 0)" in run.stderr, run.explain()
    assert "job succeeded after 2 rounds and 1 resets" in run.stderr
    # From the stop (stamped by the worker just before it stopped itself) to the survivors'
    # re-formed round: detection, eviction, abort, rendezvous, group and state sync.
    stopped_at = run.of("fail")[0]["time"]
    reformed_at = max(e["time"] for e in run.of("reset") if e["round"] == 2)
    assert reformed_at - stopped_at <= 10.0, f"re-formed {reformed_at - stopped_at:.1f} s after"


def test_a_steady_job_keeps_its_ranks_and_a_slow_step_is_not_taken_for_a_frozen_worker(
    tmp_path: Path,
) -> None:
    """Two hosts of two slots, one round from start to end: ranks by host and slot, the
    launcher's output prefixed by rank; rank 0's step 2 of epoch 1 takes two heartbeat
    timeouts, and nobody is taken for frozen."""
    slow_s = 2 * HEARTBEAT_TIMEOUT_S
    run = run_job(
        tmp_path,
        launcher_args=[
            *("-np", "4", "-H", "127.0.1.1:2,127.0.1.2:2"),
            *("--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)),
        ],
        worker_args=worker_args("--slow", f"1:2:0:{slow_s}", epochs=2),
    )
    assert run.returncode == 0, run.explain()
    done = assert_trained_exactly_once(run, epochs=2)
    assert {d["round"] for d in done} == {1}
    assert ranks_by_host(done) == {
        ("127.0.1.1", 0): 0,
        ("127.0.1.1", 1): 1,
        ("127.0.1.2", 0): 2,
        ("127.0.1.2", 1): 3,
    }
    assert "[0]<stderr>:" in run.stdout and "[3]<stderr>:" in run.stdout
    assert [e["rank"] for e in run.of("slow")] == [0]
    # The others waited in the collective for rank 0's whole slow step.
    slow_at = run.of("slow")[0]["time"]
    waited = [
        e["time"] - slow_at
        for e in run.of("step")
        if (e["epoch"], e["batch"], e["rank"]) == (1, 2, 1)
    ]
    assert len(waited) == 1 and waited[0] >= slow_s - 0.5, waited
    assert "heartbeat" not in run.stderr, run.explain()
    assert "job succeeded after 1 rounds and 0 resets" in run.stderr


def test_blacklisted_host_returns_after_cooldown_and_rejoins(tmp_path: Path) -> None:
    run = run_job(
        tmp_path,
        launcher_args=["-np", "3", "--min-np", "2", "--blacklist-cooldown-range", "1", "2"],
        worker_args=worker_args("--fail", "0:2:2:sigkill", "--expect-sizes", "3,3,3"),
        schedule={0: "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1"},
    )
    assert run.returncode == 0, run.explain()
    done = assert_trained_exactly_once(run)
    assert sorted(d["host"] for d in done) == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    assert {d["round"] for d in done} == {3}, "failure round, then the host's return"
    assert "blacklisted host 127.0.1.3" in run.stderr


def test_reset_limit_exceeded_fails_the_job(tmp_path: Path) -> None:
    run = run_job(
        tmp_path,
        launcher_args=["-np", "3", "--min-np", "1", "--reset-limit", "1"],
        worker_args=worker_args("--fail", "0:1:2:sigkill", "--fail", "0:3:1:sigkill"),
        schedule={0: "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1"},
    )
    assert run.returncode == 1, run.explain()
    assert "reset limit 1 exceeded" in run.stderr, run.explain()


def test_too_few_slots_for_min_np_times_out(tmp_path: Path) -> None:
    run = run_job(
        tmp_path,
        launcher_args=["-np", "2", "--min-np", "2", "--elastic-timeout", "2"],
        worker_args=worker_args("--fail", "0:1:1:sigkill"),
        schedule={0: "127.0.1.1:1,127.0.1.2:1"},
    )
    assert run.returncode == 1, run.explain()
    assert "elastic timeout" in run.stderr and "min_np" in run.stderr, run.explain()


def test_one_sided_collective_failure_resyncs_from_rank_0(tmp_path: Path) -> None:
    """Rank 1 alone raises HorovodInternalError just before a commit that rank 0 makes: no
    process exits, and the two ranks' last commits differ. The next round must re-sync
    every rank from rank 0, or the ranks silently train on from different states."""
    run = run_job(
        tmp_path,
        launcher_args=["-np", "2", "-H", "127.0.1.1:1,127.0.1.2:1"],
        worker_args=worker_args("--fail", "1:3:1:internal"),
        timeout_s=150.0,
    )
    assert run.returncode == 0, run.explain()
    assert run.of("fail"), run.explain()
    done = assert_trained_exactly_once(run)
    assert {d["round"] for d in done} == {2}
    assert "rolling back to the last commit" in run.stdout
    # The two ranks' commits differ: the state is synced, not taken as already in sync.
    assert "state already in sync" not in run.stdout, run.explain()
    # The other rank hears of the rollback from the driver, not from a collective timeout.
    failed_at = run.of("fail")[0]["time"]
    resumed_at = min(e["time"] for e in run.of("reset") if e["round"] == 2)
    assert resumed_at - failed_at < 15, f"the ranks took {resumed_at - failed_at:.1f} s to resume"
