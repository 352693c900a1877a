"""The worker contract: what the launcher and the operator write is what the worker reads back,
field for field, and both front ends write the same variables."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.checkpoint_policy import CheckpointPolicy
from elasticjob.launcher.processes import WorkerEnvironment
from elasticjob.library_env import ENV_PYTHONUNBUFFERED
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.script_env import HOROVOD_PLACE_ENV
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import (
    WORKER_CONTRACT_ENV,
    SecretKey,
    WorkerConfig,
    WorkerSettings,
    pod_env,
    standalone_backend,
)
from tests.support.rendezvous_jobs import slot_of

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1)
"""A value an environment variable can hold (an empty one means unset)."""
SECONDS = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
POLICIES = st.builds(
    CheckpointPolicy,
    folder=TEXT,
    every_commits=st.integers(min_value=0, max_value=10**9),
    interval_s=SECONDS,
    keep=st.integers(min_value=1, max_value=1000),
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "rendezvous_url": TEXT,
    "job": TEXT,
    "rendezvous_ca": TEXT,
    "backend": TEXT,
    "collective_timeout_s": SECONDS,
    "round_wait_s": SECONDS,
    "heartbeat_interval_s": SECONDS,
    "orphan_timeout_s": SECONDS,
    "defer_sigterm": st.booleans(),
    "probe_after_s": SECONDS,
    "timeline_dir": TEXT,
    "max_restarts": st.integers(min_value=0, max_value=10**9),
    "warm_start": st.booleans(),
    "start_server_after_s": SECONDS,
    "checkpoint": POLICIES,
    "token": TEXT,
    "hostname": TEXT,
    "node": TEXT,
    "local_rank": st.integers(min_value=0, max_value=1023),
    "bind_address": TEXT,
}
REQUIRED = {
    name: FIELDS[name]
    for name, field in WorkerConfig.model_fields.items()
    if field.is_required() and name not in ("node", "bind_address")  # the host name if not given
}
OPTIONAL = {name: values for name, values in FIELDS.items() if name not in REQUIRED}

EVERY_SETTING = WorkerSettings(
    rendezvous_url="https://rdzv:8470",
    job="ns.job",
    rendezvous_ca="-----BEGIN CERTIFICATE-----\n",
    backend="gloo",
    collective_timeout_s=30,
    round_wait_s=120,
    heartbeat_interval_s=0.2,
    orphan_timeout_s=10,
    defer_sigterm=True,
    probe_after_s=0.5,
    timeline_dir="/tmp/timeline",
    max_restarts=3,
    warm_start=False,
    start_server_after_s=5,
    checkpoint=CheckpointPolicy("/ckpt", every_commits=10, keep=2),
)


def test_the_examples_cover_every_field() -> None:
    assert set(FIELDS) == set(WorkerConfig.model_fields)
    assert EVERY_SETTING.model_fields_set == set(WorkerSettings.model_fields)


@given(st.fixed_dictionaries(REQUIRED, optional=OPTIONAL))
def test_every_field_round_trips_through_the_environment(values: dict[str, Any]) -> None:
    config = WorkerConfig(**values)
    env = config.to_env()
    read = WorkerConfig.from_env(env)
    assert read == config
    assert read.model_fields_set == config.model_fields_set
    assert read.to_env() == env


def test_a_field_left_unset_is_not_written_and_reads_back_as_its_default() -> None:
    config = WorkerConfig.of(
        WorkerSettings(rendezvous_url="http://r:1", job="job"),
        token="t",
        hostname="h",
        local_rank=0,
        bind_address="127.0.0.1",
    )
    read = WorkerConfig.from_env(config.to_env())
    assert read is not None
    for name, field in WorkerSettings.model_fields.items():
        if not field.is_required():
            assert getattr(read, name) == field.default, name


def test_seconds_are_written_as_the_shortest_exact_number() -> None:
    settings = WorkerSettings(
        rendezvous_url="u", job="j", collective_timeout_s=30, round_wait_s=0.1 + 0.2
    )
    env = settings.to_env()
    assert env["ELASTICJOB_COLLECTIVE_TIMEOUT"] == "30"
    assert float(env["ELASTICJOB_ROUND_WAIT"]) == 0.1 + 0.2


def test_the_pod_and_the_launcher_write_the_same_variables() -> None:
    """The operator's pods and ``elasticjob-run`` write the same variables for the same
    settings, every variable of the contract; what a pod states by value is what the
    launcher writes."""
    worker = WorkerId("h", 0)
    environment = WorkerEnvironment(EVERY_SETTING, JobKey("k3y"))
    launched = environment.for_worker(worker, "10.0.0.1", slot_of(worker))
    launched.pop(ENV_PYTHONUNBUFFERED)
    for name in HOROVOD_PLACE_ENV:  # the place planned at start: a launcher's only
        launched.pop(name)
    entries = pod_env(EVERY_SETTING, token=SecretKey("job-rendezvous", "pod-a"))
    in_pod = {entry["name"]: entry for entry in entries}
    assert len(in_pod) == len(entries), "no variable is given twice"
    assert set(in_pod) == set(launched) == WORKER_CONTRACT_ENV
    by_value = {name: e["value"] for name, e in in_pod.items() if "value" in e}
    assert by_value == {name: launched[name] for name in by_value}
    from_pod = {name: e["valueFrom"] for name, e in in_pod.items() if "valueFrom" in e}
    assert {name: launched[name] for name in from_pod} == {
        "ELASTICJOB_TOKEN": JobKey("k3y").worker_credential("h"),  # its host's own
        "ELASTICJOB_HOSTNAME": "h",
        "ELASTICJOB_NODE": "h",
        "ELASTICJOB_BIND_ADDRESS": "10.0.0.1",
        "HOROVOD_HOSTNAME": "h",
    }


def test_the_node_and_the_bind_address_are_the_host_unless_given() -> None:
    """A launcher's host is a machine; a pod is a host of its own on a node it shares."""
    env = {"ELASTICJOB_RENDEZVOUS_URL": "http://r:1", "ELASTICJOB_JOB": "j"}
    env |= {"ELASTICJOB_TOKEN": "t", "ELASTICJOB_HOSTNAME": "pod-a", "ELASTICJOB_LOCAL_RANK": "0"}
    alone = WorkerConfig.from_env(env)
    assert alone is not None and (alone.node, alone.bind_address) == ("pod-a", "pod-a")
    on_node = WorkerConfig.from_env(env | {"ELASTICJOB_NODE": "node-1"})
    assert on_node is not None and on_node.node == "node-1"
    entries = pod_env(EVERY_SETTING, token=SecretKey("job-rendezvous", "pod-a"))
    (node,) = (e for e in entries if e["name"] == "ELASTICJOB_NODE")
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize(
    ("environ", "backend"),
    [({}, "auto"), ({"ELASTICJOB_BACKEND": ""}, "auto"), ({"ELASTICJOB_BACKEND": "gloo"}, "gloo")],
)
def test_a_process_without_a_launcher_takes_its_backend_from_the_variable(
    environ: dict[str, str], backend: str
) -> None:
    """E.g. Gloo on a machine with CUDA, where ``auto`` would pick NCCL."""
    assert standalone_backend(environ) == backend
