"""One job's controller on an in-memory Kubernetes API (``tests/support/fake_kube.py``) with
the real driver and rendezvous: its pods, how it pushes them to the driver, what follows a
failure (one transition: the driver decides and blacklists, then the event and the deletion),
blacklisting with one owner, adoption after a restart, and scale-in.

The controller's periodic pass is set to a minute: everything a test sees follows from the
events it pushes, never from a tick.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.job_record import EventKind, JobRecordData
from elasticjob.driver.job_state import BlacklistEntry, JobState, RoundInForce, RoundMember
from elasticjob.operator.api import parse_spec
from elasticjob.operator.controller import JobController
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.job_records import parse_record, record_config_map
from elasticjob.operator.kube import KubeApi, secret_value
from elasticjob.operator.supervisor import StopSignal
from elasticjob.rendezvous.job_credentials import JobKey, Speaker
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import NoticeKind, RendezvousRequest, RendezvousStatus, WorkerId
from elasticjob.worker_contract import ENV_TOKEN
from tests.support.crd_model import with_changes
from tests.support.fake_kube import Deletion, FakeKube

DEADLINE_S = 5.0


class Job:
    """A controller running one job against the fake API, and the moves of the test."""

    def __init__(self, kube: FakeKube, body: dict[str, Any]) -> None:
        self.kube = kube
        self.body = body
        self.service = RendezvousService()
        self.controller = JobController(
            "ns",
            body["metadata"]["name"],
            cast(KubeApi, kube),
            self.service,
            ControllerSettings("http://rendezvous:8470", reconcile_interval_s=60.0),
            set(),
        )
        kube.watch_pods(self.controller.on_pod_event)

    @property
    def driver(self) -> ElasticDriver:
        assert self.controller.driver is not None
        return self.controller.driver

    async def until(self, what: Callable[[], object], deadline_s: float = DEADLINE_S) -> None:
        """Let the loop run until ``what()`` holds (driver state, which no API call shows)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline_s
        while not what():
            if loop.time() > give_up:
                raise TimeoutError(f"not within {deadline_s} s")
            await asyncio.sleep(0)

    async def pods(self, count: int) -> list[str]:
        """The job's pods once there are ``count``, in the order they were made."""
        await self.kube.wait_for(lambda: len(self.kube.pods) >= count)
        return list(self.kube.pods)

    async def ask(self, pod: str, after_round: int = 0, *, rolled_back: bool = False) -> str:
        """The pod's worker asks for a round newer than ``after_round``, once the driver has
        launched it; the answer's status."""
        await self.until(lambda: self.launched(pod))
        request = RendezvousRequest(
            hostname=pod,
            local_rank=0,
            address="127.0.0.1",
            store_port=29500,
            after_round=after_round,
            wait_seconds=0,
            rolled_back=rolled_back,
        )
        return str((await self.driver.rendezvous.rendezvous(request)).status)

    def launched(self, pod: str) -> bool:
        """Whether the driver admitted the pod's worker: a member of the round in force, or of
        the round it plans."""
        planned = self.driver.rendezvous.planned_round().slots
        return WorkerId(pod, 0) in self.driver.slots or any(s.hostname == pod for s in planned)

    async def start_round_1(self, nodes: dict[str, str]) -> list[str]:
        """Run the job's pods on ``nodes`` (by pod order) and form round 1 with them."""
        pods = await self.pods(len(nodes))
        for pod, node in zip(pods, nodes.values(), strict=True):
            self.kube.run_pod(pod, node)
        for pod in pods:
            await self.ask(pod)
        await self.kube.wait_for(lambda: "RoundFormed" in self.kube.event_reasons())
        assert self.driver.round == 1
        return pods

    async def notices(self) -> list[tuple[NoticeKind, tuple[str, ...]]]:
        response = await self.driver.rendezvous.notices(0, 0)
        return [(n.kind, n.hosts) for n in response.notices]


@asynccontextmanager
async def running(
    body: dict[str, Any], kube: FakeKube | None = None, stopped: StopSignal | None = None
) -> AsyncIterator[Job]:
    job = Job(kube or FakeKube(), body)
    task = asyncio.create_task(job.controller.run(job.body, stopped or StopSignal()))
    try:
        await job.kube.wait_for(lambda: job.controller.driver is not None or task.done())
        yield job
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def new_job(**spec: Any) -> dict[str, Any]:
    return FakeKube().job_body("train", with_changes(**spec))


async def test_a_new_job_gets_its_token_its_pods_and_its_budget_then_a_created_event() -> None:
    async with running(new_job(replicas=3)) as job:
        pods = await job.pods(3)
        await job.kube.wait_for(lambda: "Created" in job.kube.event_reasons())
        assert list(job.kube.secrets) == ["train-rendezvous"]
        assert job.kube.budgets["train-workers"]["spec"]["minAvailable"] == 2
        assert all(p.startswith("train-worker-") for p in pods)
        assert job.driver.hosts.current_hosts == (), "none runs yet: no host"
        # Each pod reads its own credential (under its name), written before it was made.
        key = JobKey(secret_value(job.kube.secrets["train-rendezvous"], "key") or "")
        for pod in pods:
            (token,) = [
                e
                for e in job.kube.pods[pod]["spec"]["containers"][0]["env"]
                if e["name"] == ENV_TOKEN
            ]
            assert token["valueFrom"]["secretKeyRef"] == {"name": "train-rendezvous", "key": pod}
            credential = secret_value(job.kube.secrets["train-rendezvous"], pod) or ""
            assert key.speaker(credential) == Speaker(pod)


async def test_a_pod_that_starts_running_is_pushed_to_the_driver_at_once() -> None:
    async with running(new_job(replicas=2)) as job:
        first, second = await job.pods(2)
        job.kube.run_pod(first, "n1")
        await job.until(lambda: job.driver.hosts.current_hosts == ((first, 1),), 1.0)
        job.kube.run_pod(second, "n2")
        await job.until(lambda: len(job.driver.hosts.current_hosts) == 2, 1.0)


async def test_a_failed_pod_is_told_to_the_driver_announced_blacklisted_deleted_replaced() -> None:
    async with running(new_job(replicas=3)) as job:
        a, b, c = await job.start_round_1({"a": "n1", "b": "n2", "c": "n3"})
        job.kube.end_pod(b, 1)
        await job.kube.wait_for(lambda: Deletion(b, 0) in job.kube.deletions)
        assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, (b,))]
        assert job.driver.snapshot().recovering
        reasons = job.kube.event_reasons()
        assert "WorkerFailed" in reasons and "NodeBlacklisted" in reasons
        failed = next(e for e in job.kube.events if e.reason == "WorkerFailed")
        assert failed.message == f"pod {b} on n2: worker exited with 1"
        replacement = (await job.pods(3))[-1]
        affinity = job.kube.pods[replacement]["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == ["n2"]
        # The driver struck the pod's node when it heard of the failure; the survivors roll
        # back and the round ends without another strike: one, not two.
        for pod in (a, c):
            await job.ask(pod, 1, rolled_back=True)
        await job.until(lambda: job.driver.round == 2)
        assert job.controller.pods.blacklist.keys.strikes("n2") == 1
        assert job.kube.event_reasons().count("NodeBlacklisted") == 1
        # The failed pod's credential is gone from the Secret, the others' kept.
        data = job.kube.secrets["train-rendezvous"]["data"]
        await job.kube.wait_for(lambda: b not in data)
        assert {a, c, replacement} <= set(data)


async def test_a_killed_worker_fails_its_pod_at_once_and_the_pod_is_deleted() -> None:
    async with running(new_job(replicas=2)) as job:
        _, b = await job.start_round_1({"a": "n1", "b": "n2"})
        await job.driver.launcher.kill(WorkerId(b, 0), "it sent no heartbeat for 5.0 s")
        assert job.driver.snapshot().recovering, "the exit is reported before anything else"
        await job.kube.wait_for(lambda: Deletion(b, 0) in job.kube.deletions)
        failed = next(e for e in job.kube.events if e.reason == "WorkerFailed")
        assert failed.message == (
            f"pod {b} on n2: a worker process was killed: it sent no heartbeat for 5.0 s"
        )
        assert "n2" in job.controller.pods.blacklist.active()


async def test_a_pod_deleted_behind_the_operators_back_fails_without_blacklisting() -> None:
    async with running(new_job(replicas=2)) as job:
        _, b = await job.start_round_1({"a": "n1", "b": "n2"})
        job.kube.remove_pod(b)
        await job.until(lambda: job.driver.snapshot().recovering)
        assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, (b,))]
        await job.pods(2)  # replaced
        assert not job.controller.pods.blacklist.active()
        assert "NodeBlacklisted" not in job.kube.event_reasons()
        assert all(d.name != b for d in job.kube.deletions)


async def test_a_scale_in_drains_the_newest_pod_and_the_driver_lets_it_leave() -> None:
    async with running(new_job(replicas=3)) as job:
        pods = await job.start_round_1({"a": "n1", "b": "n2", "c": "n3"})
        job.body["spec"]["replicas"] = 2
        job.controller.job_updated()
        await job.kube.wait_for(lambda: "ScalingIn" in job.kube.event_reasons())
        await job.until(lambda: len(job.driver.hosts.current_hosts) == 2)
        assert (await job.notices()) == [(NoticeKind.HOSTS_REMOVED, (pods[-1],))]


async def test_a_restarted_operator_adopts_the_recorded_round_and_fails_its_missing_pods() -> None:
    """The job's record is what a new driver resumes from; its status, output only, is not
    read back (here it shows an older round and no blacklisting)."""
    kube = FakeKube()
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
    body = kube.job_body("train", with_changes(replicas=2))
    body["status"] = {"phase": "Running", "round": 3, "workers": [{"pod": "x", "ranks": [0]}]}
    state = JobState(
        resets=3,
        last_round=4,
        round=RoundInForce(
            round=4,
            members=(
                RoundMember(host="train-worker-a", ranks=(0,)),
                RoundMember(host="train-worker-b", ranks=(1,)),
            ),
        ),
        blacklist=(BlacklistEntry(key="n9", until=until.timestamp(), strikes=2),),
    )
    record = JobRecordData(job="ns.train", state=state, written_at=time.time())
    await kube.apply_config_map("ns", record_config_map(body, record))
    kube.add_pod(adopted_pod(body, "train-worker-a"))
    kube.run_pod("train-worker-a", "n1")
    async with running(body, kube) as job:
        assert job.driver.round == 4, "the recorded round is adopted"
        events = job.driver.journal.record.events
        adopted = [e for e in events if e.kind is EventKind.ADOPTED]
        assert [(e.round, e.world_size) for e in adopted] == [(4, 2)], "the record marks it"
        assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("train-worker-b",))]
        assert job.controller.pods.blacklist.keys.strikes("n9") == 2
        assert job.driver.snapshot().reset_count >= 3
        await job.kube.wait_for(lambda: job.kube.statuses)
        assert "Created" not in job.kube.event_reasons()


def adopted_pod(job: dict[str, Any], name: str) -> dict[str, Any]:
    """A worker pod of ``job`` that an earlier operator created."""
    owner = {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    return {
        "metadata": {
            "name": name,
            "labels": {"elasticjob.dev/job-name": job["metadata"]["name"]},
            "ownerReferences": [owner],
        },
        "spec": {"containers": [{"name": "worker", "image": "img"}]},
    }


async def test_a_job_handed_over_lets_its_waiting_workers_ask_again_elsewhere() -> None:
    """The operator stands down (another replica leads): a worker waiting for its next round
    is answered as if its wait ran out, never told that the job finished, and the job leaves
    this operator's rendezvous service (a standby's answers 503: the worker retries)."""
    stopped = StopSignal()
    async with running(new_job(replicas=2, minReplicas=2), stopped=stopped) as job:
        pods = await job.start_round_1({"a": "node-a", "b": "node-b"})
        rendezvous = job.driver.rendezvous
        request = RendezvousRequest(
            hostname=pods[0],
            local_rank=0,
            address="127.0.0.1",
            store_port=29500,
            after_round=1,
            wait_seconds=30,
        )
        waiting = asyncio.create_task(rendezvous.rendezvous(request))
        await job.until(lambda: rendezvous.long_polls > 0)
        stopped.handover = True
        stopped.set()
        job.controller.job_updated()
        answer = await asyncio.wait_for(waiting, DEADLINE_S)
        assert answer.status is RendezvousStatus.PENDING
        await job.until(lambda: not job.service.serves(job.controller.job_id))


async def test_a_finishing_job_replaces_no_member_whose_pod_succeeded() -> None:
    async with running(new_job(replicas=2)) as job:
        a, _ = await job.start_round_1({"a": "n1", "b": "n2"})
        created = len(job.kube.pods)
        job.kube.end_pod(a, 0)
        await job.until(lambda: job.driver.finishing)
        await job.controller.pods.reconcile(job.body, parse_spec(job.body["spec"]))
        assert len(job.kube.pods) == created, "no replacement for a member that finished"


async def test_a_job_created_suspended_is_suspended_by_its_record_and_resumes_from_it() -> None:
    """The job's record, not its status, says that it is suspended: a job created suspended
    gets a record that says so (and a Suspended status and event, no pod); resumed, its
    driver starts from that record (a Resumed event, no Created)."""
    kube = FakeKube()
    job = Job(kube, kube.job_body("train", with_changes(replicas=2, suspend=True)))
    task = asyncio.create_task(job.controller.run(job.body, StopSignal()))
    try:
        await kube.wait_for(lambda: "Suspended" in kube.event_reasons())
        record = parse_record(kube.config_maps["train-record"])
        assert record.state.suspended_since is not None
        assert [e.kind for e in record.events] == [EventKind.SUSPENDED]
        assert kube.statuses[-1]["phase"] == "Suspended" and not kube.pods
        job.body["spec"]["suspend"] = False
        job.controller.job_updated()
        await kube.wait_for(lambda: "Resumed" in kube.event_reasons())
        assert "Created" not in kube.event_reasons()
        await job.pods(2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
