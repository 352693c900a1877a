"""Entry point: ``python -m devcluster.agent --run-dir DIR``."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from devcluster.agent.main import Agent
from devcluster.build import cached_kubernetes, kube_version
from devcluster.config import ClusterConfig


def main() -> None:
    """Run the agent of the cluster in ``--run-dir`` until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m devcluster.agent")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    cfg = ClusterConfig.load(args.run_dir)
    kube = cached_kubernetes(cfg.cache_dir)
    version = f"v{kube_version(kube)}" if kube else "v1.20.2"
    asyncio.run(Agent(cfg, version).run())


if __name__ == "__main__":
    main()
