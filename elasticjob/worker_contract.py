"""The worker contract: what a launcher tells a worker process through its environment.

Two front ends write it and the worker runtime reads it: ``elasticjob-run`` puts it in each
worker process's environment, the operator in each worker pod's manifest. Every variable is
a field of :class:`WorkerSettings` (the same for every worker of a job) or of
:class:`WorkerConfig` (a process's own: its host's credential, its host, slot and bind address),
declared once with its type, its default and its variable; both sides go through them:

- :meth:`WorkerSettings.to_env` and :meth:`WorkerConfig.to_env` write the variables of the
  fields a writer set. A field it did not set (or set to None) is left out, and the worker
  applies its default.
- :func:`pod_env` writes the same variables as a pod manifest's ``env`` list, with the
  values Kubernetes supplies (the pod's name and IP, the token from a Secret) as
  ``valueFrom`` references.
- :meth:`WorkerConfig.from_env` reads them back in the worker; an unset or empty variable
  means the field's default.

Torch-free: the launcher, the operator and the worker runtime all import it.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from elasticjob.checkpoint_policy import CheckpointPolicy
from elasticjob.env_values import (
    Flag,
    Seconds,
    Variable,
    Whole,
    raw_value,
    read_seconds,
    read_whole,
    seconds_text,
)

# The contract's variables (see the fields of WorkerSettings and WorkerConfig for each).
ENV_RENDEZVOUS_URL: Final = "ELASTICJOB_RENDEZVOUS_URL"
ENV_JOB: Final = "ELASTICJOB_JOB"
ENV_TOKEN: Final = "ELASTICJOB_TOKEN"
ENV_HOSTNAME: Final = "ELASTICJOB_HOSTNAME"
ENV_NODE: Final = "ELASTICJOB_NODE"
ENV_LOCAL_RANK: Final = "ELASTICJOB_LOCAL_RANK"
ENV_BIND_ADDRESS: Final = "ELASTICJOB_BIND_ADDRESS"
ENV_BACKEND: Final = "ELASTICJOB_BACKEND"
ENV_RENDEZVOUS_CA: Final = "ELASTICJOB_RENDEZVOUS_CA"
ENV_COLLECTIVE_TIMEOUT: Final = "ELASTICJOB_COLLECTIVE_TIMEOUT"
ENV_ROUND_WAIT: Final = "ELASTICJOB_ROUND_WAIT"
ENV_HEARTBEAT_INTERVAL: Final = "ELASTICJOB_HEARTBEAT_INTERVAL"
ENV_ORPHAN_TIMEOUT: Final = "ELASTICJOB_ORPHAN_TIMEOUT"
ENV_DEFER_SIGTERM: Final = "ELASTICJOB_DEFER_SIGTERM"
ENV_PROBE_AFTER: Final = "ELASTICJOB_PROBE_AFTER"
ENV_TIMELINE_DIR: Final = "ELASTICJOB_TIMELINE_DIR"
ENV_CHECKPOINT_DIR: Final = "ELASTICJOB_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_COMMITS: Final = "ELASTICJOB_CHECKPOINT_EVERY_COMMITS"
ENV_CHECKPOINT_INTERVAL: Final = "ELASTICJOB_CHECKPOINT_INTERVAL"
ENV_CHECKPOINT_KEEP: Final = "ELASTICJOB_CHECKPOINT_KEEP"
ENV_MAX_RESTARTS: Final = "ELASTICJOB_MAX_RESTARTS"
ENV_WARM_START: Final = "ELASTICJOB_WARM_START"
ENV_START_SERVER_AFTER: Final = "ELASTICJOB_START_SERVER_AFTER"

# The training script's launch-time variables (horovodrun's and torchrun's): its host and
# slot, known when the process starts (``elasticjob.script_env`` writes the others each round).
ENV_HOROVOD_HOSTNAME: Final = "HOROVOD_HOSTNAME"
ENV_HOROVOD_LOCAL_RANK: Final = "HOROVOD_LOCAL_RANK"
ENV_TORCH_LOCAL_RANK: Final = "LOCAL_RANK"

_Value = TypeVar("_Value")


def launch_env(hostname: _Value, local_rank: int) -> dict[str, _Value | str]:
    """The script's launch-time variables of a process on ``hostname`` in slot ``local_rank``
    (``hostname`` is a value, or where a pod finds it: see :func:`pod_env`)."""
    return {
        ENV_HOROVOD_HOSTNAME: hostname,
        ENV_HOROVOD_LOCAL_RANK: str(local_rank),
        ENV_TORCH_LOCAL_RANK: str(local_rank),
    }


SCRIPT_LAUNCH_ENV: Final = frozenset(launch_env("", 0))
"""The script variables known when a worker process starts (its host and slot)."""


class _Checkpoints(Variable):
    """A :class:`CheckpointPolicy`: its folder in ``name`` and its frequencies and count in
    three more variables (see :func:`checkpoint_env`)."""

    @property
    def names(self) -> tuple[str, ...]:
        return (
            self.name,
            ENV_CHECKPOINT_EVERY_COMMITS,
            ENV_CHECKPOINT_INTERVAL,
            ENV_CHECKPOINT_KEEP,
        )

    def write(self, value: Any) -> dict[str, str]:
        return checkpoint_env(value)

    def read(self, environ: Mapping[str, str]) -> CheckpointPolicy | None:
        return checkpoint_from_env(environ)


def checkpoint_env(policy: CheckpointPolicy) -> dict[str, str]:
    """The variables of a job's checkpoint policy (``ELASTICJOB_CHECKPOINT_*``)."""
    return {
        ENV_CHECKPOINT_DIR: policy.folder,
        ENV_CHECKPOINT_EVERY_COMMITS: str(policy.every_commits),
        ENV_CHECKPOINT_INTERVAL: seconds_text(policy.interval_s),
        ENV_CHECKPOINT_KEEP: str(policy.keep),
    }


def checkpoint_from_env(environ: Mapping[str, str] = os.environ) -> CheckpointPolicy | None:
    """The checkpoint policy a worker was given; None without a checkpoint folder. Raises
    :class:`ValueError` naming a malformed variable."""
    folder = raw_value(environ, ENV_CHECKPOINT_DIR)
    if folder is None:
        return None
    given: dict[str, Any] = {
        "every_commits": read_whole(environ, ENV_CHECKPOINT_EVERY_COMMITS, least=0),
        "interval_s": read_seconds(environ, ENV_CHECKPOINT_INTERVAL),
        "keep": read_whole(environ, ENV_CHECKPOINT_KEEP, least=1),
    }
    return CheckpointPolicy(folder, **{k: v for k, v in given.items() if v is not None})


def variable_of(field: FieldInfo) -> Variable:
    """The variable(s) a field of the contract is written to and read from."""
    (variable,) = (m for m in field.metadata if isinstance(m, Variable))
    return variable


# --- the contract ------------------------------------------------------------------------


class WorkerSettings(BaseModel):
    """What every worker of a job is told. A writer sets the fields it decides; a field it
    leaves unset (or sets to None) is not written, and the worker applies the default. (A
    writer whose values may be None builds it with ``model_validate``.)"""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    rendezvous_url: Annotated[str, Variable(ENV_RENDEZVOUS_URL)]
    """The job's rendezvous service; its presence is what makes a process a worker of a job
    (without it the runtime runs standalone)."""
    job: Annotated[str, Variable(ENV_JOB)]
    """The job's name on the rendezvous service."""
    rendezvous_ca: Annotated[str | None, Variable(ENV_RENDEZVOUS_CA)] = None
    """PEM text (not a path) of the CA certificate(s) an ``https://`` rendezvous URL is
    verified against (unset: the system's trusted CAs)."""
    backend: Annotated[str, Variable(ENV_BACKEND)] = "auto"
    """The torch.distributed backend: ``gloo``, ``nccl`` or ``auto`` (NCCL with CUDA)."""
    collective_timeout_s: Annotated[float, Seconds(ENV_COLLECTIVE_TIMEOUT)] = 60.0
    """Bound on any collective; failures the driver sees abort groups much sooner."""
    round_wait_s: Annotated[float, Seconds(ENV_ROUND_WAIT)] = 900.0
    """How long a worker waits for its next round before giving up."""
    heartbeat_interval_s: Annotated[float, Seconds(ENV_HEARTBEAT_INTERVAL)] = 0.0
    """Seconds between heartbeats to the rendezvous service (0: none). The driver kills a
    worker that sent none for its heartbeat timeout, so a driver that kills sets it to a
    fraction of that timeout."""
    orphan_timeout_s: Annotated[float, Seconds(ENV_ORPHAN_TIMEOUT)] = 900.0
    """How long the worker keeps running while the rendezvous service is unreachable (its
    launcher or operator is gone), then exits; 0: forever. The default outlasts an operator
    restart; the local launcher sets a short one."""
    defer_sigterm: Annotated[bool, Flag(ENV_DEFER_SIGTERM)] = False
    """Whether the first SIGTERM lets the worker leave at its next host-update check
    (pods)."""
    probe_after_s: Annotated[float, Seconds(ENV_PROBE_AFTER)] = 2.0
    """How long a collective (or forming a round's group) may block before the heartbeat
    thread probes the round's peers and reports those it cannot reach (0: never). Healthy
    steps of 1,024 ranks stay well below it; a slow one only costs a few TCP connects."""
    timeline_dir: Annotated[str | None, Variable(ENV_TIMELINE_DIR)] = None
    """Folder where each worker process appends its timeline events (``--timeline-filename``
    of ``elasticjob-run``; unset: no timeline is recorded)."""
    max_restarts: Annotated[int, Whole(ENV_MAX_RESTARTS)] = 0
    """Restart mode: the job's restart limit, which the script reads as
    ``TORCHELASTIC_MAX_RESTARTS`` (0, torchrun's default, when the job sets none)."""
    warm_start: Annotated[bool, Flag(ENV_WARM_START)] = True
    """Whether starts fork from a start server with torch imported (``0``: cold): a restart-mode
    agent's script's, and a pod's slot that its supervisor restarts in place."""
    start_server_after_s: Annotated[float, Seconds(ENV_START_SERVER_AFTER)] = 10.0
    """When a pod's start server starts after its slots (not to slow their own imports)."""
    checkpoint: Annotated[CheckpointPolicy | None, _Checkpoints(ENV_CHECKPOINT_DIR)] = None
    """The job's durable checkpoint policy (unset: none, no fallback): its folder, how often
    and how many are kept. Rank 0 writes the committed state there; a new rank 0 without a
    survivor loads the newest complete checkpoint."""

    @model_validator(mode="before")
    @classmethod
    def _none_is_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def to_env(self) -> dict[str, str]:
        """The variables of the fields set."""
        env: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            if name in self.model_fields_set:
                env.update(variable_of(field).write(getattr(self, name)))
        return env

    @classmethod
    def _from_environ(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        """The values of the variables given in ``environ``, by field."""
        given = {name: variable_of(field).read(environ) for name, field in cls.model_fields.items()}
        return {name: value for name, value in given.items() if value is not None}


DEFAULT_TO_HOST: Final = ("node", "bind_address")
"""The fields of :class:`WorkerConfig` that default to its host name."""


class WorkerConfig(WorkerSettings):
    """A worker process's contract: the job's settings and the process's own values. A pod
    takes these from Kubernetes (see :func:`pod_env`); the script's launch-time variables
    (:data:`SCRIPT_LAUNCH_ENV`) follow from them."""

    token: Annotated[str, Field(repr=False), Variable(ENV_TOKEN)]
    """The worker's bearer credential on the rendezvous service: its host's own, which speaks
    for that host only (``elasticjob.rendezvous.job_credentials``)."""
    hostname: Annotated[str, Variable(ENV_HOSTNAME)]
    """The host the process runs on, as the driver names it (a pod: its name)."""
    node: Annotated[str, Variable(ENV_NODE)]
    """The machine the process runs on, which fails as one: a pod's node (pods of one node
    are distinct hosts to the driver but die together); the host name when not given."""
    local_rank: Annotated[int, Whole(ENV_LOCAL_RANK)]
    """The process's slot on its host."""
    bind_address: Annotated[str, Variable(ENV_BIND_ADDRESS)]
    """The address the process binds to (a pod: its IP); the host name when not given."""

    @model_validator(mode="before")
    @classmethod
    def _binds_to_its_host(cls, data: Any) -> Any:
        if isinstance(data, dict) and "hostname" in data:
            missing = [key for key in DEFAULT_TO_HOST if data.get(key) is None]
            return {**data, **dict.fromkeys(missing, data["hostname"])}
        return data

    @classmethod
    def of(
        cls,
        settings: WorkerSettings,
        *,
        token: str,
        hostname: str,
        local_rank: int,
        bind_address: str,
        node: str | None = None,
    ) -> WorkerConfig:
        """The contract of a process of the job ``settings`` describe (the fields they set
        stay the set ones); ``node`` None: the host is the machine."""
        return cls(
            **{name: getattr(settings, name) for name in settings.model_fields_set},
            token=token,
            hostname=hostname,
            node=hostname if node is None else node,
            local_rank=local_rank,
            bind_address=bind_address,
        )

    def to_env(self) -> dict[str, str]:
        """The variables of the fields set, and the script's launch-time ones."""
        return {**super().to_env(), **launch_env(self.hostname, self.local_rank)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerConfig | None:
        """Read the contract (None: not started by a launcher, no rendezvous URL). Raises
        :class:`RuntimeError` naming the missing variables, :class:`ValueError` a malformed one."""
        if not environ.get(ENV_RENDEZVOUS_URL):
            return None
        given = cls._from_environ(environ)
        missing = [
            variable_of(field).name
            for name, field in cls.model_fields.items()
            if field.is_required() and name not in given and name not in DEFAULT_TO_HOST
        ]
        if missing:
            raise RuntimeError(f"{ENV_RENDEZVOUS_URL} is set but {', '.join(missing)} not")
        return cls(**given)


SLOTS_MODULE: Final = "elasticjob.worker_runtime.agents.slot_supervisor"
"""The supervisor of a pod with several slots: one worker process per slot."""


def slots_command(python: str, slots: int, command: Sequence[str]) -> list[str]:
    """The command of a pod with ``slots`` worker processes: ``python`` running the
    supervisor, which runs ``command`` once per slot."""
    return [python, "-m", SLOTS_MODULE, str(slots), "--", *command]


RESTART_AGENT_MODULE: Final = "elasticjob.worker_runtime.agents.restart_agent"
"""The restart mode's agent, which a front end starts in place of the script."""


def restart_agent_command(python: str, command: Sequence[str]) -> list[str]:
    """The command of a restart-mode worker: ``python`` running the agent, which runs
    ``command``."""
    return [python, "-m", RESTART_AGENT_MODULE, "--", *command]


HEALTH_CHECK_MODULE: Final = "elasticjob.worker_runtime.agents.health_check"
"""A pod's health check (``spec.healthCheck``), which runs before the pod's command."""
EXIT_UNHEALTHY: Final = 3
"""The exit status of a pod that failed its health check."""


def health_check_command(python: str, command: Sequence[str]) -> list[str]:
    """The command of a pod checked before it joins: ``python`` running the check, which
    runs ``command`` in its place once the pod passed."""
    return [python, "-m", HEALTH_CHECK_MODULE, "--", *command]


def standalone_backend(environ: Mapping[str, str] = os.environ) -> str:
    """The backend of a process started without a launcher (no contract): its
    ``ELASTICJOB_BACKEND`` if set, else the contract's default (``auto``)."""
    default: str = WorkerSettings.model_fields["backend"].default
    return raw_value(environ, ENV_BACKEND) or default


# --- the pod manifest's form -------------------------------------------------------------


class PodField(enum.StrEnum):
    """A value the Downward API gives a pod's container (``valueFrom.fieldRef``)."""

    NAME = "metadata.name"
    IP = "status.podIP"
    NODE = "spec.nodeName"


class SecretKey(NamedTuple):
    """A value a pod's container takes from a key of a Secret (``valueFrom.secretKeyRef``)."""

    secret: str
    key: str


def pod_env(settings: WorkerSettings, *, token: SecretKey) -> list[dict[str, Any]]:
    """The ``env`` list of a worker container: the variables of ``settings``, and those of
    :class:`WorkerConfig`'s own fields from where Kubernetes has them: the token from
    ``token``, the pod's name as host name, its node's name as node and its IP as bind
    address; slot 0 (the slots runner gives each further process its own)."""
    fields = WorkerConfig.model_fields
    from_pod: dict[str, PodField | SecretKey] = {
        variable_of(fields["token"]).name: token,
        variable_of(fields["hostname"]).name: PodField.NAME,
        variable_of(fields["node"]).name: PodField.NODE,
        variable_of(fields["bind_address"]).name: PodField.IP,
    }
    local_rank = variable_of(fields["local_rank"]).write(0)
    env = {**settings.to_env(), **from_pod, **local_rank, **launch_env(PodField.NAME, 0)}
    return [_env_entry(name, value) for name, value in env.items()]


def _env_entry(name: str, value: str | PodField | SecretKey) -> dict[str, Any]:
    if isinstance(value, PodField):
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": value.value}}}
    if isinstance(value, SecretKey):
        secret = {"name": value.secret, "key": value.key}
        return {"name": name, "valueFrom": {"secretKeyRef": secret}}
    return {"name": name, "value": value}


# --- the names the operator reserves -----------------------------------------------------

WORKER_ENV_PREFIX: Final = "ELASTICJOB_"
"""Prefix of every variable of the worker contract."""
WORKER_CONTRACT_ENV: Final = frozenset(
    {name for field in WorkerConfig.model_fields.values() for name in variable_of(field).names}
    | SCRIPT_LAUNCH_ENV
)
"""Every variable the operator may set for its workers: a pod template must not set them
(nor any other name with :data:`WORKER_ENV_PREFIX`)."""


def is_worker_contract_env(name: str) -> bool:
    """Whether ``name`` is a variable of the worker contract (the operator's to set)."""
    return name in WORKER_CONTRACT_ENV or name.startswith(WORKER_ENV_PREFIX)
