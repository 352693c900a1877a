"""The rendezvous service and the driver with 256 simulated workers (``bench/sim_worker.py``:
asyncio clients of the real protocol, heartbeats included) against a real service process
running one real driver per job (``bench/sim_service.py``): behaviour at a moderate N, not
timings (``bench/scale.py`` measures those)."""

from __future__ import annotations

from pathlib import Path

from bench.sim_cluster import ServiceProcess, hosts_of, next_round

WORKERS = 256
DEADLINE_S = 60.0
"""Upper bound on each wait (a hang fails the test instead)."""
HEARTBEAT_TIMEOUT_S = 60.0
"""Workers beat every 2 s; the timeout is long enough that a loaded machine evicts nobody."""


async def test_256_workers_form_a_round_and_every_survivor_hears_of_a_failure(
    tmp_path: Path,
) -> None:
    job = "scale-test"
    hosts = hosts_of("h", 0, WORKERS, 1)
    keys = [(job, host, 0) for host in hosts]
    async with ServiceProcess(HEARTBEAT_TIMEOUT_S, tmp_path / "service.log") as service:
        fleet = service.fleet
        assert fleet is not None
        service.add_job(job, hosts, max_np=WORKERS)

        def placed(round_number: int, members: list[tuple[str, str, int]]) -> bool:
            return all(
                key in fleet.workers and round_number in fleet.workers[key].log.assigned
                for key in members
            )

        await service.until(lambda: placed(1, keys), "round 1 formed", DEADLINE_S)
        assert sorted(fleet.workers[key].log.rank or 0 for key in keys) == list(range(WORKERS))

        victim = keys[WORKERS // 2]
        fleet.kill(victim)
        survivors = [fleet.workers[key] for key in keys if key != victim]

        def recovered() -> bool:
            return all(
                1 in worker.log.failed_heard and next_round(worker, 1) is not None
                for worker in survivors
            )

        await service.until(recovered, "every survivor told and placed", DEADLINE_S)
        assert {worker.round for worker in survivors} == {2}
        assert sorted(worker.log.rank or 0 for worker in survivors) == list(range(WORKERS - 1))
        assert 2 not in fleet.workers[victim].log.assigned

        fleet.finish(job)
        await service.until(lambda: job in service.ended, "the job's end", DEADLINE_S)
        assert service.ended[job]["success"], service.ended[job]["message"]
        assert all(worker.log.exit_code == 0 for worker in survivors)
