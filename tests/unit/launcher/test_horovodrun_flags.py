"""``elasticjob-run`` takes horovodrun's spellings and defaults, reads its hostfiles, and
refuses by name every horovodrun flag that cannot apply (and warns of those that change
nothing here)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest

from elasticjob.launcher.arguments import build_parser, parse_arguments
from elasticjob.launcher.horovodrun_flags import (
    IGNORED,
    REFUSED,
    HostfileError,
    parse_hostfile,
    python_log_level,
)
from elasticjob.launcher.job_settings import max_np
from elasticjob.launcher.output_files import RankOutputFiles, rank_width
from elasticjob.launcher.run_command import main
from elasticjob.wire.messages import WorkerId


def parse(*argv: str) -> argparse.Namespace:
    return parse_arguments(build_parser(), [*argv, "python", "train.py"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-np", "2"], {"np": 2, "min_np": None, "max_np": None}),
        (["--num-proc", "3"], {"np": 3}),
        (["-np", "2", "--min-num-proc", "1"], {"min_np": 1}),
        (["-np", "2", "--min-np", "1"], {"min_np": 1}),
        (["-np", "2", "--max-num-proc", "5"], {"max_np": 5}),
        (["-np", "2", "--slots-per-host", "2"], {"slots": 2}),
        (["-np", "2", "--slots", "2"], {"slots": 2}),
        (["-np", "1", "--network-interfaces", "lo,eth0"], {"nics": ["lo", "eth0"]}),
        (
            ["-np", "1", "--network-interface", "lo", "--network-interface", "eth0"],
            {"nics": ["lo", "eth0"]},
        ),
        (["-np", "1", "--network-interface", "lo"], {"nics": ["lo"]}),
        (["-np", "1"], {"nics": None, "gloo": False, "log_level": None, "output_filename": None}),
        (["-np", "1", "--gloo"], {"gloo": True}),
        (["-np", "1", "--log-level", "TRACE"], {"log_level": "TRACE"}),
        (["-np", "1", "--output-filename", "out"], {"output_filename": "out"}),
        (["-np", "1", "-H", "localhost:1"], {"hosts": "localhost:1"}),
        (["-np", "1", "--hosts", "localhost:1"], {"hosts": "localhost:1"}),
        (
            ["-np", "1"],
            {"elastic_timeout": 600.0, "reset_limit": None, "slots": 1, "backend": "auto"},
        ),
    ],
)
def test_horovodrun_spellings_and_defaults(argv: list[str], expected: dict[str, Any]) -> None:
    args = parse(*argv)
    assert {key: getattr(args, key) for key in expected} == expected
    assert args.command == ["python", "train.py"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-np", "2"], 2),
        (["-np", "2", "-H", "localhost:4"], 2),
        (["-np", "2", "--min-np", "1", "-H", "localhost:4"], None),
        (["-np", "2", "--min-num-proc", "2", "-H", "localhost:4"], None),
        (["-np", "2", "--host-discovery-script", "./d.sh"], None),
        (["-np", "2", "--min-np", "1", "--max-np", "3", "-H", "localhost:4"], 3),
        (["-np", "2", "--max-np", "3", "-H", "localhost:4"], 3),
    ],
)
def test_max_np_is_unbounded_in_elastic_mode_as_in_horovodrun(
    argv: list[str], expected: int | None
) -> None:
    """horovodrun: elastic mode (a discovery script or --min-np) leaves --max-np unbounded;
    its static mode runs exactly -np processes."""
    assert max_np(parse(*argv)) == expected


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("elasticjob-run ")


@pytest.mark.parametrize(
    ("level", "python_level"),
    [("TRACE", logging.DEBUG), ("INFO", logging.INFO), ("FATAL", logging.CRITICAL)],
)
def test_log_levels(level: str, python_level: int) -> None:
    assert python_log_level(level) == python_level


def test_a_bad_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-np", "1", "--log-level", "LOUD", "true"]) == 2
    assert "argument --log-level: invalid choice: 'LOUD'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("host1 slots=2\nhost2 slots=4\n", "host1:2,host2:4"),
        ("# hosts\n\n127.0.1.1 slots=2   # two\n  127.0.1.2 slots=1\n", "127.0.1.1:2,127.0.1.2:1"),
        ("localhost\n", "localhost:3"),
    ],
)
def test_hostfile(tmp_path: Path, text: str, expected: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    assert parse_hostfile(hostfile, default_slots=3) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a slots=2\nb slots=x\n", "line 2 'b slots=x': expected '<host> slots=<N>' with N >= 1"),
        ("a slots=0\n", "line 1 'a slots=0': expected"),
        ("a slot=2\n", "line 1 'a slot=2': expected"),
        ("a slots=2 extra\n", "line 1 'a slots=2 extra': expected"),
        ("a:2 slots=2\n", "line 1 'a:2 slots=2': the host name must not contain"),
        ("# nothing\n\n", "names no host"),
    ],
)
def test_a_bad_hostfile_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    with pytest.raises(HostfileError, match="hostfile") as raised:
        parse_hostfile(hostfile, default_slots=1)
    assert message in str(raised.value)


def test_hostfile_hosts_are_the_fixed_hosts(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.1.1 slots=2\n127.0.1.2 slots=2\n")
    args = parse("-np", "4", "-hostfile", str(hostfile))
    assert args.hosts == "127.0.1.1:2,127.0.1.2:2"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-np", "3", "--hostfile", "{dir}/two"], "the fixed hosts offer 2 slots (127.0.1.1:2)"),
        (["-np", "1", "--hostfile", "{dir}/bad"], "--hostfile: hostfile '{dir}/bad' line 1 'x y'"),
        (["-np", "1", "--hostfile", "{dir}/none"], "--hostfile: hostfile '{dir}/none' cannot be"),
        (
            ["-np", "1", "--hostfile", "{dir}/two", "-H", "a:1"],
            "argument -H/--hosts: not allowed with argument -hostfile/--hostfile",
        ),
        (
            ["-np", "1", "--network-interfaces", "lo,,eth0"],
            "--network-interfaces 'lo,,eth0': an interface name is empty",
        ),
    ],
)
def test_bad_host_arguments_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "two").write_text("127.0.1.1 slots=2\n")
    (tmp_path / "bad").write_text("x y\n")
    assert main([a.format(dir=tmp_path) for a in argv] + ["true"]) == 2
    assert f"elasticjob-run: error: {message.format(dir=tmp_path)}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("names", "reason"), [pytest.param(n, r, id=n[-1]) for n, r in REFUSED.items()]
)
def test_a_horovodrun_flag_that_cannot_apply_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], names: tuple[str, ...], reason: str
) -> None:
    for name in names:
        assert main(["-np", "1", name, "true"]) == 2
        err = capsys.readouterr().err
        assert "usage: elasticjob-run" in err
        assert f"error: horovodrun's {name} does not apply to elasticjob-run: {reason}" in err


@pytest.mark.parametrize(
    ("names", "values", "reason"),
    [pytest.param(n, v, r, id=n[-1]) for n, (v, r) in IGNORED.items()],
)
def test_a_horovodrun_tuning_flag_runs_with_a_warning_naming_it(
    capsys: pytest.CaptureFixture[str], names: tuple[str, ...], values: int, reason: str
) -> None:
    for name in names:
        args = parse("-np", "2", name, *["7"] * values)
        assert args.command == ["python", "train.py"], "the flag took only its own values"
        assert args.np == 2
        err = capsys.readouterr().err
        assert f"warning: horovodrun's {name} has no effect here and is ignored: {reason}" in err


def test_mpi_flags_are_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-np", "1", "--mpi-args=--map-by ppr:6:node", "true"]) == 2
    assert (
        "horovodrun's --mpi-args does not apply to elasticjob-run: elasticjob-run has no MPI"
        in (capsys.readouterr().err)
    )


@pytest.mark.parametrize(
    ("np", "max_np", "width"), [(1, None, 1), (4, None, 1), (11, None, 2), (2, 100, 2)]
)
def test_rank_padding(np: int, max_np: int | None, width: int) -> None:
    assert rank_width(np, max_np) == width


def test_output_files_layout(tmp_path: Path) -> None:
    files = RankOutputFiles(tmp_path / "out", width=2)
    worker = WorkerId("127.0.1.1", 1)
    files.write(worker, 3, "stdout", "a\n")
    files.write(worker, 3, "stdout", "b\n")
    files.write(worker, 3, "stderr", "oops\n")
    files.write(worker, None, "stdout", "joining\n")
    files.close()
    assert (tmp_path / "out" / "rank.03" / "stdout").read_text() == "a\nb\n"
    assert (tmp_path / "out" / "rank.03" / "stderr").read_text() == "oops\n"
    assert (tmp_path / "out" / "unranked" / "127.0.1.1.1" / "stdout").read_text() == "joining\n"


def test_timeouts_default_to_horovodrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (parse("-np", "1").elastic_timeout, parse("-np", "1").start_timeout) == (600, 120)
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "30")
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "7.5")
    args = parse("-np", "1")
    assert (args.elastic_timeout, args.start_timeout) == (30.0, 7.5)
    assert parse("-np", "1", "--start-timeout", "9").start_timeout == 9.0


def test_a_bad_timeout_variable_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "soon")
    assert main(["-np", "1", "true"]) == 2
    assert "argument --start-timeout: invalid float value: 'soon'" in capsys.readouterr().err
