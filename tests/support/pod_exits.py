"""The exit codes of a set of pods' containers, watched while the pods end: what a test that
stops the operator checks it ended with (a deleted pod's status is gone with it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes


class PodExits:
    """Watches the pods of ``selector`` in ``namespace`` from :meth:`start` on, recording each
    container's exit code once it has terminated and which pods were deleted."""

    def __init__(self, core: Any, namespace: str, selector: str) -> None:
        self._core, self._namespace, self._selector = core, namespace, selector
        self._watch = kubernetes.watch.Watch()
        self._changed = threading.Condition()
        self._seen: set[str] = set()
        self._deleted: set[str] = set()
        self._stopped = False
        self.codes: dict[str, int] = {}
        """Exit codes by ``pod/container``."""
        self._thread = threading.Thread(target=self._follow, name="pod-exits", daemon=True)

    def start(self, timeout_s: float = 30.0) -> PodExits:
        """Start watching; return once the pods there are now were seen (at least one)."""
        self._thread.start()
        self._wait(lambda: bool(self._seen), timeout_s, "no pod seen")
        return self

    def wait_gone(self, timeout_s: float) -> dict[str, int]:
        """Wait until every pod seen is deleted; stop watching and return the exit codes.
        Raises :class:`AssertionError` at the deadline, naming the pods left."""
        try:
            self._wait(lambda: not self._seen - self._deleted, timeout_s, "pods not gone")
        finally:
            self._stopped = True
            self._watch.stop()
        return dict(self.codes)

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{what} ({self._selector} in {self._namespace}) after {timeout_s:.0f} "
                        f"s: seen {sorted(self._seen)}, deleted {sorted(self._deleted)}, "
                        f"exits {self.codes}"
                    )
                self._changed.wait(left)

    def _follow(self) -> None:
        stream = self._watch.stream(
            self._core.list_namespaced_pod,
            self._namespace,
            label_selector=self._selector,
            timeout_seconds=600,
        )
        try:
            for event in stream:
                self._record(event["type"], event["object"])
        except Exception:
            if not self._stopped:  # stopping closes the stream under the loop
                raise

    def _record(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        with self._changed:
            self._seen.add(name)
            for status in pod.status.container_statuses or ():
                terminated = status.state.terminated if status.state else None
                if terminated is not None:
                    self.codes[f"{name}/{status.name}"] = terminated.exit_code
            if kind == "DELETED":
                self._deleted.add(name)
            self._changed.notify_all()
