"""The worker process: its setup and its liveness.

Setup, before any group exists: the slot's device (``devices.py`` decides; made current under
NCCL) and the network interface of Gloo's and NCCL's sockets (``interfaces.py``); under the
operator, a SIGTERM that lets the worker leave at its next host-update check.

Liveness (:class:`Liveness`): a heartbeat thread (``heartbeat.py``) tells the driver the
process is alive, so that it can tell a frozen process from a slow step, and ends the process
once the rendezvous service has been unreachable for the orphan timeout (its launcher or
operator is gone); while the training thread is blocked on the round's group for
``probe_after_s``, or at once after a collective failed, each beat carries the round's peers
that a probe did not reach (``reachability.py``), so the driver kills a member cut off from
its peers. A worker without a heartbeat (standalone, or a driver that neither kills silent
workers nor sets an orphan timeout) has :class:`NoHeartbeat`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

import torch

from elasticjob.library_env import ENV_CUDA_VISIBLE_DEVICES
from elasticjob.wire.messages import HeldShards, PeerEndpoint, StepPace
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.heartbeat import Heartbeat
from elasticjob.worker_runtime.link.reachability import PROBE_TIMEOUT_S, PeerProber
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.rounds.devices import device_for_slot
from elasticjob.worker_runtime.rounds.interfaces import pin_socket_interfaces

logger = get_logger(__name__)

ORPHANED_EXIT_CODE = 1
"""The exit status of a worker that ends because its rendezvous stayed unreachable."""


def use_device(local_rank: int, backend: str) -> torch.device:
    """The device of slot ``local_rank`` under ``backend`` (``devices.py``), made current
    under NCCL."""
    plan = device_for_slot(
        local_rank,
        backend,
        torch.cuda.device_count() if backend == "nccl" else 0,
        os.environ.get(ENV_CUDA_VISIBLE_DEVICES),
    )
    if plan.cuda_index is not None:
        torch.cuda.set_device(plan.cuda_index)
        logger.info(
            "slot %d uses %s%s",
            local_rank,
            plan.device,
            f" ({ENV_CUDA_VISIBLE_DEVICES} entry {plan.physical})"
            if plan.physical is not None
            else "",
        )
    return plan.device


def wrapped_command(argv: Sequence[str] | None, module: str) -> list[str] | None:
    """The command after ``--`` of ``python -m MODULE -- COMMAND...`` (``argv``: the
    arguments, None: this process's); None, with the usage printed, when there is none."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(f"usage: python -m {module} -- COMMAND...", file=sys.stderr)
        return None
    return args


def pin_interfaces(bind_address: str) -> None:
    """Give Gloo's and NCCL's sockets the interface of ``bind_address``; before any group
    exists, since they read it when they create one."""
    pinned = pin_socket_interfaces(bind_address)
    if pinned:
        logger.info(
            "sockets of Gloo and NCCL on the interface of %s: %s",
            bind_address,
            " ".join(f"{name}={value}" for name, value in sorted(pinned.items())),
        )


def defer_sigterm(in_round: Callable[[], bool]) -> None:
    """Under the operator, a pod being deleted or preempted gets SIGTERM while the driver
    tells the job the pod leaves: keep training until this worker is released at the next
    host-update check (no rollback for anyone). A second SIGTERM, or one while not
    ``in_round()``, ends the process at once. Only the main thread can install it."""
    if threading.current_thread() is not threading.main_thread():
        return
    requested = False

    def on_sigterm(signum: int, _frame: object) -> None:
        nonlocal requested
        if requested or not in_round():
            raise SystemExit(128 + signum)
        requested = True
        logger.warning("SIGTERM: leaving at the next host-update check (again: exit now)")

    signal.signal(signal.SIGTERM, on_sigterm)


def exit_orphaned(silent_s: float) -> NoReturn:
    """The rendezvous service has been unreachable for the orphan timeout: nobody is left to
    run this job; end the process at once (called on the heartbeat thread)."""
    logger.error(
        "the rendezvous service has been unreachable for %.0f s: the launcher or operator "
        "is gone; exiting",
        silent_s,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ORPHANED_EXIT_CODE)


class Liveness(Protocol):
    """How the process shows the driver that it is alive (see the module docstring)."""

    def start(self) -> None:
        """Start beating."""

    def joined_round(self, round_number: int, peers: Sequence[PeerEndpoint]) -> None:
        """The worker joins ``round_number``, whose service gave it ``peers`` to probe."""

    def collective_failed(self, round_number: int) -> None:
        """A collective of ``round_number`` failed here: probe its peers and beat now."""

    def beat_now(self) -> None:
        """Send the next beat at once (what it carries changed). Thread-safe."""

    def stop(self) -> None:
        """Send no more beats (the driver has this process's result). Thread-safe."""


class Heartbeating(Liveness):
    """A :class:`Heartbeat` whose beats carry what its :class:`PeerProber` found."""

    def __init__(self, heartbeat: Heartbeat, prober: PeerProber) -> None:
        self._heartbeat = heartbeat
        self._prober = prober

    def start(self) -> None:
        self._heartbeat.start()

    def joined_round(self, round_number: int, peers: Sequence[PeerEndpoint]) -> None:
        self._prober.joined_round(round_number, peers)

    def collective_failed(self, round_number: int) -> None:
        self._prober.collective_failed(round_number)
        self._heartbeat.beat_now()

    def beat_now(self) -> None:
        self._heartbeat.beat_now()

    def stop(self) -> None:
        self._heartbeat.stop()


class NoHeartbeat(Liveness):
    """A process that does not beat (nor probes its peers)."""

    def start(self) -> None:
        pass

    def joined_round(self, round_number: int, peers: Sequence[PeerEndpoint]) -> None:
        pass

    def collective_failed(self, round_number: int) -> None:
        pass

    def beat_now(self) -> None:
        pass

    def stop(self) -> None:
        pass


def liveness_for(
    config: WorkerConfig,
    client: RendezvousClient,
    blocked_for: Callable[[], float | None],
    pace: Callable[[], StepPace | None] = lambda: None,
    held: Callable[[], HeldShards | None] = lambda: None,
) -> Liveness:
    """The liveness of a worker started by a launcher: beats at the driver's heartbeat
    interval, or without one only to notice being orphaned (at a quarter of the orphan
    timeout); peers probed once the round's group has been ``blocked_for`` the probe delay,
    only for a driver that asked for beats (the one that kills silent workers); each beat
    carries the worker's step ``pace`` and the sharded state's shards it ``held`` then."""
    if config.heartbeat_interval_s <= 0 and config.orphan_timeout_s <= 0:
        return NoHeartbeat()
    interval = config.heartbeat_interval_s or config.orphan_timeout_s / 4
    probe_after = config.probe_after_s if config.heartbeat_interval_s > 0 else 0.0
    prober = PeerProber(blocked_for, probe_after, min(PROBE_TIMEOUT_S, interval))
    heartbeat = Heartbeat(
        client,
        config.hostname,
        config.local_rank,
        interval,
        orphan_timeout_s=config.orphan_timeout_s,
        on_orphaned=exit_orphaned,
        probe=prober.probe,
        pace=pace,
        held=held,
    )
    return Heartbeating(heartbeat, prober)
