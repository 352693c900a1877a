"""The Dockerfiles as text (tests/devcluster/test_images.py builds and runs them): they parse,
run as non-root from pinned bases that a build argument replaces, keep torch out of the
operator image, install third-party dependencies before the project's sources, and run the
commands that the chart, the example job and devcluster's image mapping expect."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import yaml

from elasticjob.operator.api import validate

REPO = Path(__file__).resolve().parents[3]
KNOWN = {"FROM", "ARG", "ENV", "RUN", "WORKDIR", "COPY", "USER", "CMD", "ENTRYPOINT"}


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = (REPO / name).read_text().replace("\\\n", " ")
    parsed = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        assert keyword in KNOWN, f"{name}: unknown instruction {keyword!r}"
        parsed.append((keyword, rest.strip()))
    return parsed


def values(parsed: list[tuple[str, str]], keyword: str) -> list[str]:
    return [rest for kind, rest in parsed if kind == keyword]


PIP_ARGS = {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"}


def check_common(parsed: list[tuple[str, str]]) -> None:
    """What both Dockerfiles share: the base argument, pip's build-time configuration, the
    dependencies' layer before the sources, the user."""
    assert values(parsed, "FROM") == ["${BASE}"]
    assert "BASE=python:3.11-slim-bookworm" in values(parsed, "ARG")
    # pip settings are optional build arguments without defaults (unset: pip's own).
    assert set(values(parsed, "ARG")) >= PIP_ARGS
    assert not [e for e in values(parsed, "ENV") if "PIP_" in e]
    # A base without Python gets it from apt.
    assert "command -v python3" in values(parsed, "RUN")[0]
    # Third-party dependencies are installed before the project's sources are copied.
    kinds = [(kind, rest) for kind, rest in parsed if kind in ("RUN", "COPY")]
    first_source = kinds.index(("COPY", "elasticjob ./elasticjob"))
    assert any(k == "RUN" and "pip install" in r for k, r in kinds[:first_source])
    assert values(parsed, "USER") == ["10001"]
    # Debian has a group "operator" (gid 37): useradd without --gid would fail on it.
    (adduser,) = [r for r in values(parsed, "RUN") if "useradd" in r]
    assert "--uid 10001" in adduser and "--gid 10001" in adduser


def test_operator_image() -> None:
    parsed = instructions("Dockerfile.operator")
    check_common(parsed)
    installs = " ".join(values(parsed, "RUN"))
    assert '".[operator]"' in installs and "torch" not in installs
    (entrypoint,) = values(parsed, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["elasticjob-operator"]
    deployment = (REPO / "deploy/helm/elasticjob-operator/templates/deployment.yaml").read_text()
    assert re.search(r"command:\s*\n\s*- elasticjob-operator\n", deployment), "the chart's command"


def test_worker_image() -> None:
    parsed = instructions("Dockerfile.worker")
    check_common(parsed)
    assert "TORCH_VERSION=2.13.0" in values(parsed, "ARG")
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in values(parsed, "ARG")
    assert values(parsed, "WORKDIR")[-1] == "/opt/elasticjob"
    installs = " ".join(values(parsed, "RUN"))
    assert '"torch==${TORCH_VERSION}"' in installs and '".[worker,examples]"' in installs
    # The example job's command runs in the image's working directory, where the examples are.
    job = yaml.safe_load((REPO / "examples/elasticjob.yaml").read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("elasticjob/worker:")
    assert container["command"][0] == "python"
    assert (REPO / container["command"][1]).is_file()
    assert json.loads(values(parsed, "CMD")[-1])[1] == container["command"][1]
    assert shlex.split(values(parsed, "COPY")[-1]) == ["examples", "/opt/elasticjob/examples"]


def test_the_sharded_example_job_is_valid_and_runs_the_script_with_flags_it_takes() -> None:
    job = yaml.safe_load((REPO / "examples/elasticjob-sharded.yaml").read_text())
    assert validate(job["spec"]) == []
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("elasticjob/worker:")
    python, script, *flags = container["command"]
    assert python == "python" and (REPO / script).is_file()
    spec = importlib.util.spec_from_file_location("sharded_lm_train", REPO / script)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(flags)
    assert args.redundancy >= 1 and args.epochs > 0
