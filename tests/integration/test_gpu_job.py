"""A job on GPUs under NCCL through ``elasticjob-run``: each worker on its slot's GPU, NCCL
and Gloo on the interface of the worker's address. Needs CUDA (skipped without it): one
worker per visible GPU, all on one loopback host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from elasticjob.worker_contract import (
    ENV_GLOO_SOCKET_IFNAME,
    ENV_NCCL_SOCKET_IFNAME,
    ENV_TORCH_LOCAL_RANK,
)
from tests.support.worker_scripts import launcher, run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

WORKER = Path(__file__).parent / "workers" / "gpu_worker.py"


def test_each_worker_trains_on_its_slots_gpu_under_nccl(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    out = tmp_path / "results"
    command = launcher("-np", str(gpus), "-H", f"127.0.1.1:{gpus}", "--backend", "nccl")
    job = run([*command, sys.executable, str(WORKER), "--out", str(out)], out)
    assert job.returncode == 0 and len(job.results) == gpus, job.explain()
    for rank, seen in enumerate(job.results):
        device = f"cuda:{rank}"  # one host: the local rank is the rank
        assert (seen["device"], seen["current_device"]) == (device, rank)
        assert (seen["allreduce_device"], seen["allreduce"]) == (device, [float(gpus)] * 3)
        assert (seen["size"], seen["steps"]) == (gpus, 3) and seen["nccl_built"] > 0
        assert seen["env"][ENV_TORCH_LOCAL_RANK] == str(rank)
        assert seen["env"][ENV_GLOO_SOCKET_IFNAME] == "lo"  # carries 127.0.1.1
        assert seen["env"][ENV_NCCL_SOCKET_IFNAME] == "lo"
