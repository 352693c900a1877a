"""The images cannot be built here (no container engine): check what can be checked. They
parse, run as non-root from pinned bases, keep torch out of the operator image, and run the
commands that the chart, the example job and devcluster's image mapping expect."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

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


def test_operator_image() -> None:
    parsed = instructions("Dockerfile.operator")
    assert values(parsed, "FROM") == ["python:3.11-slim-bookworm"]
    assert values(parsed, "USER") == ["10001"]
    installs = " ".join(values(parsed, "RUN"))
    assert '".[operator]"' in installs and "torch" not in installs
    (entrypoint,) = values(parsed, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["elasticjob-operator"]
    deployment = (REPO / "deploy/helm/elasticjob-operator/templates/deployment.yaml").read_text()
    assert re.search(r"command:\s*\n\s*- elasticjob-operator\n", deployment), "the chart's command"


def test_worker_image() -> None:
    parsed = instructions("Dockerfile.worker")
    assert values(parsed, "FROM") == ["${BASE}"]
    assert "BASE=python:3.11-slim-bookworm" in values(parsed, "ARG")
    assert "TORCH_VERSION=2.13.0" in values(parsed, "ARG")
    assert values(parsed, "USER") == ["10001"]
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
