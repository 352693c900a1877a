"""What ``elasticjob submit --follow``, ``status`` and ``logs`` print, from the job's status
(pure functions), and the command's arguments and exit codes without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticjob import cli
from elasticjob.submit.commands import describe, split_script_args
from elasticjob.submit.follow import exit_code, news, rank_pod

STORY_1 = "2026-12-01T10:00:00Z round 1 formed: 2 workers (start)"
STORY_2 = "2026-12-01T10:01:00Z round 1 failed: pod a-1 failed (exit code 137)"
STORY_3 = "2026-12-01T10:01:02Z round 2 formed: 1 workers (a worker failed)"


def status(phase: str, *history: str, **fields: Any) -> dict[str, Any]:
    conditions = [
        {"type": phase, "status": "True", "reason": f"{phase}Reason", "message": f"{phase} msg"}
    ]
    return {"phase": phase, "history": list(history), "conditions": conditions, **fields}


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        pytest.param(
            None,
            status("Running", STORY_1),
            [f"[elasticjob] {STORY_1}", "[elasticjob] Running (RunningReason): Running msg"],
            id="first-sight",
        ),
        pytest.param(
            status("Running", STORY_1),
            status("Running", STORY_1, STORY_2, STORY_3),
            [f"[elasticjob] {STORY_2}", f"[elasticjob] {STORY_3}"],
            id="new-story-lines",
        ),
        pytest.param(status("Running", STORY_1), status("Running", STORY_1), [], id="no-change"),
        pytest.param(
            status("Running", STORY_1),
            status("Failed", STORY_1),
            ["[elasticjob] Failed (FailedReason): Failed msg"],
            id="ended",
        ),
        pytest.param(
            status("Running", STORY_1, STORY_2),
            status("Running", STORY_2),
            [],
            id="oldest-line-dropped",
        ),
    ],
)
def test_news(before: dict[str, Any] | None, after: dict[str, Any], lines: list[str]) -> None:
    assert news(before, after) == lines


def test_the_pod_of_a_rank_and_the_exit_code_of_a_phase() -> None:
    workers = [{"pod": "a-1", "ranks": [2, 3]}, {"pod": "a-0", "ranks": [0, 1]}]
    assert rank_pod({"workers": workers}) == "a-0"
    assert rank_pod({"workers": workers}, 3) == "a-1"
    assert rank_pod({}, 0) is None
    assert [exit_code({"phase": p}) for p in ("Succeeded", "Failed", "Running", None)] == [
        0,
        1,
        None,
        None,
    ]


def test_status_says_phase_round_workers_and_story() -> None:
    job = {
        "metadata": {"name": "train-1a2b"},
        "spec": {"replicas": 3, "minReplicas": 2, "maxReplicas": 4},
        "status": status(
            "Running",
            STORY_1,
            round=1,
            worldSize=2,
            replicas=2,
            workers=[{"pod": "train-1a2b-0", "node": "n1", "ranks": [0]}],
            progress={"epoch": 1, "step": 40, "samplesPerSecond": 812.5},
        ),
    }
    assert describe(job) == [
        "train-1a2b: Running (RunningReason): Running msg",
        "round 1: 2 workers; 2 pods of 3 wanted (2 to 4)",
        "epoch 1, step 40, 812.5 samples/s",
        "  rank 0: pod train-1a2b-0 on n1",
        f"  {STORY_1}",
    ]


def test_the_scripts_arguments_follow_a_double_dash() -> None:
    assert split_script_args(["submit", "t.py", "--", "--lr", "1", "--"]) == (
        ["submit", "t.py"],
        ["--lr", "1", "--"],
    )
    assert split_script_args(["status", "x"]) == (["status", "x"], [])


def test_submit_dry_run_prints_the_manifests_and_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    argv = ["submit", str(script), "--name", "t", "--workers", "2:3", "--dry-run", "--", "-v"]
    assert cli.main(argv) == 0
    config_map, job = yaml.safe_load_all(capsys.readouterr().out)
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "ElasticJob"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python",
        "train.py",
        "-v",
    ]
    assert cli.main(["submit", str(script), "--workers", "0", "--dry-run"]) == 2
    assert "--workers: need 1 <= MIN <= MAX" in capsys.readouterr().err
    assert cli.main(["submit", str(script), "--env", "NOEQUALS", "--dry-run"]) == 2
    assert "--env: NAME=VALUE" in capsys.readouterr().err


def test_commands_against_a_missing_kubeconfig_say_so_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope")
    assert cli.main(["status", "x", "--kubeconfig", missing]) == 1
    assert "elasticjob status:" in capsys.readouterr().err
