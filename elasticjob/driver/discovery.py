"""Host discovery for the local launcher: an executable discovery script, or a fixed list of
hosts, polled (:func:`poll_hosts`) and pushed to the driver as horovodrun does. (The operator
pushes its worker pods instead.)

Both read the same host syntax: ``host`` (the host has ``default_slots`` slots) or
``host:slots``. A script prints one such entry per line (blank lines are ignored); a
fixed list is written ``h1:2,h2:4,h3``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from pydantic import TypeAdapter, ValidationError

from elasticjob.driver.driver_types import DiscoveryError
from elasticjob.wire.messages import HostName

logger = logging.getLogger(__name__)

MAX_SLOTS_PER_HOST = 1024
"""The most slots one host may offer: local ranks on the wire go up to 1023."""

_HOSTNAME: TypeAdapter[str] = TypeAdapter(HostName)
_SLOTS = re.compile(r"[0-9]+")
_STDERR_TAIL_CHARS = 1000
_POLL_S = 0.1

RUN_MARK_ENV = "ELASTICJOB_DISCOVERY_RUN"
"""Set, to a value unique to each run, in the environment of a discovery script."""

POLL_INTERVAL_S: Final = 1.0
"""How often the local launcher runs its host discovery."""


class HostDiscovery(abc.ABC):
    """Finds the hosts available to the job right now."""

    blocks: bool = True
    """Whether finding the hosts may block (a script, a file, the network): it then runs in a
    thread. False for a discovery that reads memory only, which runs on the loop."""

    @abc.abstractmethod
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Return ``{hostname: slots}`` for every host that may run workers now.

        Raises :class:`DiscoveryError` with a message naming the problem when discovery
        itself fails (as opposed to finding no hosts, which returns ``{}``).
        """


class HostsListener(Protocol):
    """Who hears what a discovery finds (the driver)."""

    def update_hosts(self, hosts: Mapping[str, int]) -> None:
        """These hosts, ``{host: slots}``, may run workers now."""

    def discovery_failed(self, error: str) -> None:
        """The host discovery failed with ``error``."""


async def discover_once(discovery: HostDiscovery, listener: HostsListener) -> None:
    """Run ``discovery`` once (in a thread when it may block) and tell ``listener``."""
    try:
        if discovery.blocks:
            hosts = await asyncio.to_thread(discovery.find_available_hosts_and_slots)
        else:
            hosts = discovery.find_available_hosts_and_slots()
    except DiscoveryError as exc:
        listener.discovery_failed(str(exc))
    else:
        listener.update_hosts(hosts)


async def poll_hosts(
    discovery: HostDiscovery, listener: HostsListener, interval_s: float = POLL_INTERVAL_S
) -> None:
    """Run ``discovery`` every ``interval_s`` and tell ``listener`` (cancel to stop)."""
    while True:
        await asyncio.sleep(interval_s)
        await discover_once(discovery, listener)


def _marked_processes(mark: bytes) -> list[int]:
    """The pids of this user's processes whose environment holds ``mark``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                if mark in environ.read().split(b"\0"):
                    pids.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return pids


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every process whose environment holds ``RUN_MARK_ENV=mark``; return their
    pids (none where there is no ``/proc``)."""
    if not os.path.isdir("/proc"):
        return []
    pids = _marked_processes(f"{RUN_MARK_ENV}={mark}".encode())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        logger.warning("killed %d processes the discovery script left behind: %s", len(pids), pids)
    return pids


def _check_default_slots(default_slots: int) -> None:
    if not 1 <= default_slots <= MAX_SLOTS_PER_HOST:
        raise ValueError(
            f"default_slots must be from 1 to {MAX_SLOTS_PER_HOST}, got {default_slots}"
        )


def _parse_entry(text: str, default_slots: int) -> tuple[str, int]:
    """Parse ``host`` or ``host:slots``; raise ``ValueError`` saying what is wrong."""
    host, colon, slots_text = text.partition(":")
    if ":" in slots_text:
        raise ValueError("expected 'host' or 'host:slots' but found more than one ':'")
    try:
        _HOSTNAME.validate_python(host)
    except ValidationError:
        raise ValueError(
            f"invalid hostname {host!r} (expected letters, digits, '.', '-' or '_', "
            "starting with a letter or digit, at most 253 characters)"
        ) from None
    if not colon:
        return host, default_slots
    if not _SLOTS.fullmatch(slots_text) or not 1 <= int(slots_text) <= MAX_SLOTS_PER_HOST:
        raise ValueError(
            f"slots must be an integer from 1 to {MAX_SLOTS_PER_HOST}, got {slots_text!r}"
        )
    return host, int(slots_text)


def _parse_entries(
    entries: Iterable[tuple[str, str]], *, default_slots: int, source: str
) -> dict[str, int]:
    """Parse ``(location, text)`` entries into ``{host: slots}`` in order.

    ``source`` names where the entries come from and ``location`` (``"line 3"``) where each
    one is, so that an error message points at the offending text.
    """
    hosts: dict[str, int] = {}
    seen_at: dict[str, str] = {}
    for location, text in entries:
        try:
            host, slots = _parse_entry(text, default_slots)
        except ValueError as error:
            raise DiscoveryError(f"{source}: {location} {text!r}: {error}") from None
        if host in hosts:
            raise DiscoveryError(
                f"{source}: host {host!r} is listed twice ({seen_at[host]} and {location})"
            )
        hosts[host] = slots
        seen_at[host] = location
    return hosts


def parse_hosts(spec: str, default_slots: int) -> dict[str, int]:
    """Parse a host list such as ``"h1:2,h2:4,h3"`` into ``{host: slots}``, in order.

    A host without ``:slots`` gets ``default_slots``. Raises :class:`DiscoveryError` naming
    the entry (1-based) and its text for an empty entry, a bad hostname, slots that are not a
    positive integer, or more than one ``:``; and naming both entries for a duplicate host.
    """
    _check_default_slots(default_slots)
    source = f"host list {spec!r}"
    entries = [(f"entry {n}", text.strip()) for n, text in enumerate(spec.split(","), 1)]
    for location, text in entries:
        if not text:
            raise DiscoveryError(f"{source}: {location} is empty")
    return _parse_entries(entries, default_slots=default_slots, source=source)


class FixedHosts(HostDiscovery):
    """Discovery that always finds the same hosts (for example from a ``-H`` host list)."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        """Validate ``{host: slots}`` like :func:`parse_hosts` and keep a copy of it."""
        self._hosts = _parse_entries(
            ((f"host {host!r}", f"{host}:{slots}") for host, slots in hosts.items()),
            default_slots=1,
            source="fixed hosts",
        )

    blocks = False

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Return a copy of the fixed ``{host: slots}`` mapping."""
        return dict(self._hosts)


class ScriptDiscovery(HostDiscovery):
    """Discovery by running an executable script that prints the available hosts.

    The script prints one host per line, ``host`` or ``host:slots``; blank lines are ignored.
    It runs in its own process group, which is killed if it outlives ``timeout_s``. Nothing
    it started outlives a run: every process that still carries the run's mark
    (:data:`RUN_MARK_ENV` in its environment, which children inherit, even across ``setsid``
    or a double fork) is killed once the script has ended.
    """

    def __init__(
        self, script: str | os.PathLike[str], *, default_slots: int = 1, timeout_s: float = 10.0
    ) -> None:
        """``script`` is a path to an executable file (relative to the current directory)."""
        _check_default_slots(default_slots)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._name = os.fspath(script)
        self._path = os.path.abspath(self._name)
        self._default_slots = default_slots
        self._timeout_s = timeout_s

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Run the script and parse its output; raise :class:`DiscoveryError` on failure."""
        source = f"discovery script {self._name!r}"
        stdout, stderr, returncode = self._run(source)
        if returncode != 0:
            how = (
                f"was killed by signal {-returncode}"
                if returncode < 0
                else f"exited with status {returncode}"
            )
            tail = stderr.strip()[-_STDERR_TAIL_CHARS:]
            raise DiscoveryError(f"{source} {how}" + (f"; stderr: {tail}" if tail else ""))
        if stderr.strip():
            logger.debug("%s wrote to stderr: %s", source, stderr.strip())
        entries = [
            (f"line {n}", line.strip())
            for n, line in enumerate(stdout.splitlines(), 1)
            if line.strip()
        ]
        hosts = _parse_entries(entries, default_slots=self._default_slots, source=source)
        logger.debug("%s found %d hosts: %s", source, len(hosts), hosts)
        return hosts

    def _run(self, source: str) -> tuple[str, str, int]:
        """Run the script; return its stdout, stderr and exit status. Kill what it left."""
        mark = secrets.token_hex(8)
        try:
            return self._run_marked(source, mark)
        finally:
            kill_marked(mark)

    def _run_marked(self, source: str, mark: str) -> tuple[str, str, int]:
        try:
            process = subprocess.Popen(
                [self._path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
                env=os.environ | {RUN_MARK_ENV: mark},
            )
        except OSError as error:
            reason = error.strerror or str(error)
            raise DiscoveryError(f"{source} cannot be run: {reason}") from error
        deadline = time.monotonic() + self._timeout_s
        with process:
            while True:
                try:
                    stdout, stderr = process.communicate(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                ended = process.poll() is not None
                if ended:  # what the script started holds its output open
                    kill_marked(mark)
                if time.monotonic() >= deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    what = "left a process holding its output open" if ended else "did not finish"
                    raise DiscoveryError(f"{source} {what} within {self._timeout_s:g} s")
        return stdout, stderr, process.returncode
