"""Host discovery: discovery scripts, fixed host lists and their parser."""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path

import pytest

from elasticjob.driver.discovery import FixedHosts, ScriptDiscovery, parse_hosts
from elasticjob.driver.driver_types import DiscoveryError


def write_script(tmp_path: Path, body: str, name: str = "discover.sh") -> Path:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def printing(tmp_path: Path, output: str) -> Path:
    """A script that prints ``output`` verbatim."""
    data = tmp_path / "output.txt"
    data.write_text(output)
    return write_script(tmp_path, f"cat '{data}'\n")


@pytest.mark.parametrize(
    ("output", "default_slots", "expected"),
    [
        pytest.param("h1\nh2\n", 1, {"h1": 1, "h2": 1}, id="bare-hosts-get-default"),
        pytest.param("h1\nh2\n", 4, {"h1": 4, "h2": 4}, id="custom-default-slots"),
        pytest.param("h1:2\nh2:8\n", 1, {"h1": 2, "h2": 8}, id="host-colon-slots"),
        pytest.param("h1:2\nh2\n", 3, {"h1": 2, "h2": 3}, id="mixed"),
        pytest.param("\n  h1:2  \n\n\th2\n\n", 1, {"h1": 2, "h2": 1}, id="blank-lines-ignored"),
        pytest.param("", 1, {}, id="no-hosts"),
        pytest.param("10.0.0.7:2\n", 1, {"10.0.0.7": 2}, id="ipv4-address"),
        pytest.param("pod-a.ns_x:1024", 1, {"pod-a.ns_x": 1024}, id="max-slots-no-newline"),
    ],
)
def test_script_output_is_parsed(
    tmp_path: Path, output: str, default_slots: int, expected: dict[str, int]
) -> None:
    discovery = ScriptDiscovery(printing(tmp_path, output), default_slots=default_slots)
    hosts = discovery.find_available_hosts_and_slots()
    assert hosts == expected
    assert list(hosts) == list(expected)


def test_script_is_run_anew_on_every_call(tmp_path: Path) -> None:
    data = tmp_path / "output.txt"
    discovery = ScriptDiscovery(write_script(tmp_path, f"cat '{data}'\n"))
    data.write_text("h1:2\n")
    assert discovery.find_available_hosts_and_slots() == {"h1": 2}
    data.write_text("h2\nh3:3\n")
    assert discovery.find_available_hosts_and_slots() == {"h2": 1, "h3": 3}


@pytest.mark.parametrize(
    ("output", "message"),
    [
        pytest.param("h1\nh2:0\n", "line 2 'h2:0': slots must be", id="zero-slots"),
        pytest.param("h1:-1\n", "line 1 'h1:-1': slots must be", id="negative-slots"),
        pytest.param("h1:two\n", "line 1 'h1:two': slots must be", id="non-numeric-slots"),
        pytest.param("h1:1.5\n", "line 1 'h1:1.5': slots must be", id="fractional-slots"),
        pytest.param("h1:\n", "line 1 'h1:': slots must be", id="empty-slots"),
        pytest.param("h1:1025\n", "line 1 'h1:1025': slots must be", id="too-many-slots"),
        pytest.param("h1:2:3\n", "line 1 'h1:2:3': expected 'host'", id="extra-colon"),
        pytest.param("\nh1\n\nbad host\n", "line 4 'bad host': invalid hostname", id="space"),
        pytest.param(":2\n", "line 1 ':2': invalid hostname ''", id="empty-hostname"),
        pytest.param("-h1\n", "line 1 '-h1': invalid hostname", id="leading-dash"),
        pytest.param("h/1\n", "line 1 'h/1': invalid hostname", id="slash"),
        pytest.param("a" * 254 + "\n", "invalid hostname", id="hostname-too-long"),
        pytest.param(
            "h1:2\nh2\nh1:4\n", "host 'h1' is listed twice (line 1 and line 3)", id="duplicate"
        ),
    ],
)
def test_bad_script_output_names_script_and_line(tmp_path: Path, output: str, message: str) -> None:
    script = printing(tmp_path, output)
    with pytest.raises(DiscoveryError, match=re.escape(message)) as raised:
        ScriptDiscovery(script).find_available_hosts_and_slots()
    assert str(script) in str(raised.value)


def test_non_zero_exit_is_an_error_with_status_and_stderr(tmp_path: Path) -> None:
    script = write_script(tmp_path, "echo h1\necho 'cluster API unreachable' >&2\nexit 3\n")
    with pytest.raises(DiscoveryError, match="exited with status 3") as raised:
        ScriptDiscovery(script).find_available_hosts_and_slots()
    assert str(script) in str(raised.value)
    assert "cluster API unreachable" in str(raised.value)


def test_missing_script_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "absent.sh"
    with pytest.raises(DiscoveryError, match="cannot be run") as raised:
        ScriptDiscovery(script).find_available_hosts_and_slots()
    assert str(script) in str(raised.value)


def test_non_executable_script_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/sh\necho h1\n")
    script.chmod(0o644)
    with pytest.raises(DiscoveryError, match="cannot be run"):
        ScriptDiscovery(script).find_available_hosts_and_slots()


def test_script_that_runs_too_long_is_killed(tmp_path: Path) -> None:
    script = write_script(tmp_path, "echo h1\nsleep 5\n")
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"did not finish within 0\.5 s") as raised:
        ScriptDiscovery(script, timeout_s=0.5).find_available_hosts_and_slots()
    assert time.monotonic() - started < 4
    assert str(script) in str(raised.value)


def test_script_discovery_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="default_slots"):
        ScriptDiscovery(tmp_path / "discover.sh", default_slots=0)
    with pytest.raises(ValueError, match="timeout_s"):
        ScriptDiscovery(tmp_path / "discover.sh", timeout_s=0.0)


@pytest.mark.parametrize(
    ("spec", "default_slots", "expected"),
    [
        pytest.param("h1:2,h2:4,h3", 1, {"h1": 2, "h2": 4, "h3": 1}, id="mixed-slots-and-default"),
        pytest.param("h1", 8, {"h1": 8}, id="single-host-default"),
        pytest.param(" h1:2 , h2 ", 1, {"h1": 2, "h2": 1}, id="spaces-around-entries"),
    ],
)
def test_parse_hosts(spec: str, default_slots: int, expected: dict[str, int]) -> None:
    hosts = parse_hosts(spec, default_slots)
    assert hosts == expected
    assert list(hosts) == list(expected)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("h1:2,h2:x", "entry 2 'h2:x': slots must be", id="bad-slots"),
        pytest.param("h1:2:2", "entry 1 'h1:2:2': expected 'host'", id="extra-colon"),
        pytest.param("h1,h_2,h 3", "entry 3 'h 3': invalid hostname", id="bad-hostname"),
        pytest.param("h1,,h2", "entry 2 is empty", id="empty-entry"),
        pytest.param("", "entry 1 is empty", id="empty-spec"),
        pytest.param("h1,h2,h1:3", "host 'h1' is listed twice (entry 1 and entry 3)", id="dup"),
    ],
)
def test_parse_hosts_errors_name_the_entry(spec: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=re.escape(message)) as raised:
        parse_hosts(spec, 1)
    assert repr(spec) in str(raised.value)


def test_fixed_hosts_returns_a_copy_of_its_hosts() -> None:
    discovery = FixedHosts(parse_hosts("h1:2,h2", 1))
    found = discovery.find_available_hosts_and_slots()
    assert found == {"h1": 2, "h2": 1}
    found["h3"] = 1
    assert discovery.find_available_hosts_and_slots() == {"h1": 2, "h2": 1}


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        pytest.param({"h1": 0}, "slots must be", id="zero-slots"),
        pytest.param({"bad host": 1}, "invalid hostname", id="bad-hostname"),
    ],
)
def test_fixed_hosts_are_validated(hosts: dict[str, int], message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        FixedHosts(hosts)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent does not)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize(
    "output",
    [
        pytest.param(" >/dev/null 2>&1", id="detached-output"),
        pytest.param("", id="holding-the-output-open"),
    ],
)
def test_processes_a_script_starts_in_a_new_session_are_killed(tmp_path: Path, output: str) -> None:
    """``setsid`` takes a child out of the script's process group and session; it must not
    outlive the discovery run, nor, holding the script's output open, stall it."""
    pid_file = tmp_path / "pid"
    script = write_script(
        tmp_path,
        f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 300'{output} &\n"
        f"while [ ! -s {pid_file} ]; do sleep 0.05; done\necho h1:2\n",
    )
    started = time.monotonic()
    assert ScriptDiscovery(script, timeout_s=20).find_available_hosts_and_slots() == {"h1": 2}
    assert time.monotonic() - started < 15, "the run waited for the timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the script's setsid child {pid} survived the run"


def test_a_failing_script_leaves_nothing_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = write_script(
        tmp_path,
        f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 300' >/dev/null 2>&1 &\n"
        f"while [ ! -s {pid_file} ]; do sleep 0.05; done\necho boom >&2\nexit 4\n",
    )
    with pytest.raises(DiscoveryError, match="exited with status 4; stderr: boom"):
        ScriptDiscovery(script).find_available_hosts_and_slots()
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the script's setsid child {pid} survived the run"
