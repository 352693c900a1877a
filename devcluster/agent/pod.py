"""One pod's life on a node: prepare, init containers, containers, termination."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from devcluster.agent import probes, runner
from devcluster.agent.env import ConfigError, Lookup, command_line, container_env
from devcluster.agent.images import ImageResolver, ImageRuntime, UnknownImage
from devcluster.agent.kubeapi import Api, ApiError, Obj
from devcluster.agent.status import Container, now, pod_status
from devcluster.agent.volumes import Volumes, ensure_mount_target
from elasticjob.event_waits import wait_event

logger = logging.getLogger(__name__)

KILL_WAIT = 5.0


class Events(Protocol):
    """Where a pod worker reports kubelet-style events."""

    def __call__(self, pod: Obj, kind: str, reason: str, message: str) -> None: ...


@dataclass
class PodContext:
    """What a pod worker needs from the agent."""

    api: Api
    run_dir: Path
    resolver: ImageResolver
    ns_prefix: list[str] | None
    base_env: dict[str, str]
    event: Events


class PodWorker:
    """Runs one pod's containers and reports its status until it is gone."""

    def __init__(self, ctx: PodContext, pod: Obj, host_ip: str, pod_ip: str) -> None:
        self.ctx = ctx
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.host_ip = host_ip
        self.pod_ip = pod_ip
        self.dir = ctx.run_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.hosts_file = self.dir / "hosts"
        spec = pod["spec"]
        self.init = [Container(c, init=True) for c in spec.get("initContainers") or []]
        self.app = [Container(c) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.start_time = now()
        self.extra_conditions: list[Obj] = []
        self.stopping = False
        self.delete_after_stop = False
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self._stop = asyncio.Event()
        self._dirty = asyncio.Event()
        self._launch: dict[str, runner.Launch] = {}
        self._volumes = Volumes(ctx.api, pod, self.dir, ctx.run_dir)
        self._flusher = asyncio.create_task(self._flush_status())
        self.task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")

    # ----- control -------------------------------------------------------
    def update(self, pod: Obj) -> None:
        """A newer version of the pod object arrived."""
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.stopping:
            grace = meta.get("deletionGracePeriodSeconds")
            self.stop(float(grace) if grace is not None else self.grace, delete=True)

    def stop(self, grace: float, delete: bool) -> None:
        """Terminate the containers (SIGTERM, ``grace`` seconds, SIGKILL)."""
        self.grace = min(self.grace, grace) if self.stopping else grace
        self.delete_after_stop = self.delete_after_stop or delete
        self.stopping = True
        self._stop.set()

    def containers(self, name: str | None = None) -> list[Container]:
        """Containers (init and app), optionally one by name."""
        return [c for c in [*self.init, *self.app] if name is None or c.name == name]

    def log_path(self, container: str, restart: int) -> Path:
        """Log file of one run of a container."""
        return self.dir / "logs" / container / f"{restart}.log"

    def changed(self) -> None:
        """Schedule a status update."""
        self._dirty.set()

    # ----- main flow -----------------------------------------------------
    async def _run(self) -> None:
        main = asyncio.create_task(self._main())
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([main, stop], return_when=asyncio.FIRST_COMPLETED)
            if main.done() and not main.cancelled() and main.exception() is not None:
                self._report_crash(main.exception())
            if main.done() and not self.stopping:
                await stop
            await self._terminate(main)
        except asyncio.CancelledError:
            self._kill_all()
            main.cancel()
            raise
        except Exception:
            logger.exception("pod %s/%s: agent error", self.namespace, self.name)
            self._kill_all()
        finally:
            stop.cancel()
            self._flusher.cancel()
            self._volumes.cleanup()

    def _report_crash(self, err: BaseException | None) -> None:
        logger.error("pod %s/%s: cannot run: %r", self.namespace, self.name, err)
        for c in self.containers():
            if "terminated" not in c.state:
                c.waiting("CreateContainerError", f"devcluster: {err!r}")
        self.changed()

    async def _main(self) -> None:
        if await self._prepare() and await self._run_init():
            await self._run_app()

    async def _wait_stop(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if a stop was requested."""
        await wait_event(self._stop, seconds)
        return self.stopping

    async def _prepare(self) -> bool:
        """Resolve images, volumes and environments; retry like a kubelet."""
        runtimes: dict[str, ImageRuntime] = {}
        pulls = 0
        while not self.stopping:
            try:
                for c in self.containers():
                    runtimes[c.name] = self.ctx.resolver.resolve(c.spec.get("image", ""))
                    c.image_id = runtimes[c.name].image_id
            except UnknownImage as err:
                pulls += 1
                reason = "ErrImagePull" if pulls % 2 else "ImagePullBackOff"
                for c in self.containers():
                    if c.name not in runtimes:
                        c.waiting(reason, str(err))
                self.changed()
                if pulls == 1:
                    self.ctx.event(self.pod, "Warning", "Failed", f"Failed to pull image: {err}")
                if await self._wait_stop(5.0):
                    return False
                continue
            try:
                volumes = await self._volumes.materialise()
                self._launch = await self._launches(runtimes, volumes)
                return True
            except (ConfigError, ApiError) as err:
                reason = "CreateContainerConfigError"
                for c in self.containers():
                    c.waiting(reason, str(err))
                self.changed()
                self.ctx.event(self.pod, "Warning", "Failed", f"Error: {err}")
                if await self._wait_stop(2.0):
                    return False
        return False

    async def _launches(
        self, runtimes: dict[str, ImageRuntime], volumes: dict[str, Path]
    ) -> dict[str, runner.Launch]:
        lookup = Lookup(self.ctx.api, self.namespace)
        self.pod.setdefault("status", {}).update(podIP=self.pod_ip, hostIP=self.host_ip)
        spec = self.pod["spec"]
        hostname = spec.get("hostname") or self.name
        result = {}
        for c in self.containers():
            rt = runtimes[c.name]
            base = {**rt.env, **self.ctx.base_env, "HOSTNAME": hostname}
            c.env = await container_env(self.pod, c.spec, base, lookup)
            mounts = []
            for m in c.spec.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    raise ConfigError(f"volume {m['name']} not found")
                src = volumes[m["name"]] / m.get("subPath", "")
                ensure_mount_target(m["mountPath"], src.is_file())
                mounts.append((str(src), m["mountPath"], bool(m.get("readOnly"))))
            workdir = c.spec.get("workingDir") or rt.default_workdir or str(self.dir / "root")
            result[c.name] = runner.Launch(
                argv=command_line(c.spec, rt.default_command, c.env),
                env=c.env,
                workdir=workdir,
                log_path=self.log_path(c.name, 0),
                hostname=hostname,
                hosts_file=self.hosts_file if self.hosts_file.exists() else None,
                mounts=mounts,
            )
        return result

    async def _run_once(self, c: Container) -> int | None:
        """Start ``c`` and wait for it to exit; None if a stop interrupted the wait."""
        launch = self._launch[c.name]
        launch.log_path = self.log_path(c.name, c.restart_count)
        try:
            c.proc = runner.start(launch, self.ctx.ns_prefix)
        except runner.StartError as err:
            c.terminated(128, "StartError", str(err))
            self.ctx.event(self.pod, "Warning", "Failed", f"Error: {err}")
            return 128
        c.running(c.proc.pid)
        self.ctx.event(self.pod, "Normal", "Started", f"Started container {c.name}")
        probe_tasks = self._start_probes(c)
        self.changed()
        try:
            code = await runner.wait_exit(c.proc)
        finally:
            for task in probe_tasks:
                task.cancel()
            runner.kill_group(c.proc)
        c.terminated(code)
        self.changed()
        return code

    def _start_probes(self, c: Container) -> list[asyncio.Task[None]]:
        assert c.proc is not None
        tasks = []
        readiness = c.spec.get("readinessProbe")
        if readiness and not c.init:

            def ready(ok: bool, message: str) -> None:
                if "running" in c.state:
                    c.ready = ok
                    self.changed()

            tasks.append(
                asyncio.create_task(
                    probes.probe_loop(
                        readiness, c.spec, self.pod_ip, c.proc.pid, c.env, ready, False
                    )
                )
            )
        else:
            c.ready = not c.init
        liveness = c.spec.get("livenessProbe")
        if liveness and not c.init:
            proc = c.proc

            def alive(ok: bool, message: str) -> None:
                if not ok:
                    self.ctx.event(
                        self.pod, "Warning", "Unhealthy", f"Liveness probe failed: {message}"
                    )
                    runner.kill_group(proc)

            tasks.append(
                asyncio.create_task(
                    probes.probe_loop(liveness, c.spec, self.pod_ip, proc.pid, c.env, alive, True)
                )
            )
        return tasks

    def _should_restart(self, code: int) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        return not self.stopping and (policy == "Always" or (policy == "OnFailure" and code != 0))

    async def _backoff(self, c: Container) -> bool:
        """Wait before a restart; False if stopped meanwhile."""
        c.last_state = c.state
        c.restart_count += 1
        delay = 0.0 if c.restart_count == 1 else min(2.0 ** (c.restart_count - 2), 20.0)
        if delay:
            c.waiting("CrashLoopBackOff", f"back-off {delay:g}s restarting failed container")
            self.changed()
        return not await self._wait_stop(delay) if delay else not self.stopping

    async def _run_init(self) -> bool:
        for c in self.init:
            while True:
                code = await self._run_once(c)
                if self.stopping or code is None:
                    return False
                if code == 0:
                    break
                policy = self.pod["spec"].get("restartPolicy", "Always")
                if policy == "Never":
                    self.phase = "Failed"
                    self.changed()
                    return False
                if not await self._backoff(c):
                    return False
        return True

    async def _container_loop(self, c: Container) -> None:
        while True:
            code = await self._run_once(c)
            if code is None or not self._should_restart(code) or not await self._backoff(c):
                c.done = True
                return

    async def _run_app(self) -> None:
        self.phase = "Running"
        await asyncio.gather(*(self._container_loop(c) for c in self.app))
        if not self.stopping:
            self._finish_phase()

    def _finish_phase(self) -> None:
        codes = [c.exit_code for c in self.app]
        self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self.changed()

    def _running_procs(self) -> list[Container]:
        return [c for c in self.containers() if c.proc is not None and "running" in c.state]

    async def _terminate(self, main: asyncio.Task[None]) -> None:
        """Graceful stop: SIGTERM, wait the grace period, SIGKILL; then delete the pod."""
        running = self._running_procs()
        if running:
            self.ctx.event(self.pod, "Normal", "Killing", "Stopping containers")
            for c in running:
                assert c.proc is not None
                runner.signal_group(c.proc, signal.SIGTERM)
        _, pending = await asyncio.wait([main], timeout=self.grace)
        if pending:
            self._kill_all()
            _, pending = await asyncio.wait([main], timeout=KILL_WAIT)
            if pending:
                main.cancel()
        if (
            self.phase not in ("Succeeded", "Failed")
            and self.app
            and all(c.exit_code is not None for c in self.app)
        ):
            self._finish_phase()
        if not self.delete_after_stop:
            return
        with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
            await self._patch_status()
        with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
            await self.ctx.api.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )

    def _kill_all(self) -> None:
        for c in self.containers():
            if c.proc is not None:
                runner.kill_group(c.proc)

    # ----- status --------------------------------------------------------
    async def patch_status_now(self) -> None:
        """Report the current status immediately."""
        await self._patch_status()

    async def _patch_status(self) -> None:
        status = pod_status(
            self.pod,
            self.phase,
            self.init,
            self.app,
            self.pod_ip,
            self.host_ip,
            self.start_time,
            self.extra_conditions,
        )
        answer = await self.ctx.api.merge_patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status", {"status": status}
        )
        if answer.get("metadata", {}).get("uid") == self.uid:
            self.pod = answer

    async def _flush_status(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._patch_status()
            except ApiError as err:
                if err.status == 404:
                    self.stop(0.0, delete=False)
                    return
                logger.warning(
                    "pod %s/%s: status update failed: %s", self.namespace, self.name, err
                )
                await asyncio.sleep(0.5)
                self._dirty.set()
            except (TimeoutError, OSError) as err:
                logger.warning(
                    "pod %s/%s: status update failed: %r", self.namespace, self.name, err
                )
                await asyncio.sleep(0.5)
                self._dirty.set()
