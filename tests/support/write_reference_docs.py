"""Rewrite the docs' reference tables from the code (``reference_docs.py``); the chart's RBAC
table is rendered with the helm binary devcluster's prerequisites cache.

    python -m tests.support.write_reference_docs
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import yaml

from devcluster.build import cached_helm
from devcluster.config import default_cache_dir
from tests.support.reference_docs import (
    CHART,
    RELEASE,
    RELEASE_NAMESPACE,
    TABLES,
    Manifest,
    rbac_table,
    write_table,
)


def helm_template(values: Mapping[str, Any]) -> list[Manifest]:
    """The chart's objects with ``values``, rendered by the cached helm."""
    helm = cached_helm(default_cache_dir())
    assert helm is not None, "no cached helm: run scripts/devcluster-prereqs.sh"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(dict(values), file)
        file.flush()
        args = [str(helm), "template", RELEASE, str(CHART), "--values", file.name]
        args += ["--namespace", RELEASE_NAMESPACE]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def main() -> int:
    for name, (page, make) in TABLES.items():
        write_table(page, name, make())
    write_table(CHART / "README.md", "rbac", rbac_table(helm_template))
    print("reference tables rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
