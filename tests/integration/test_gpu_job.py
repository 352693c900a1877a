"""A job on GPUs under NCCL through ``elasticjob-run``: each worker on its slot's GPU, NCCL
and Gloo on the interface of the worker's address; and a torchrun script on NCCL in restart
mode, on the GPU its ``LOCAL_RANK`` names, started again in place after a SIGKILL. Needs CUDA
(skipped without it): one worker per visible GPU, all on one loopback host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from elasticjob.library_env import ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME
from elasticjob.worker_contract import ENV_TORCH_LOCAL_RANK
from tests.support.job_runs import WORKERS, run_job
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


def test_a_torchrun_script_on_nccl_is_started_again_on_its_gpu(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    job = run_job(
        tmp_path,
        launcher_args=["--mode", "restart", "-np", str(gpus), "-H", f"127.0.1.1:{gpus}"],
        worker_args=[
            "--cuda",
            "--checkpoint",
            str(tmp_path / "ckpt.pt"),
            "--fail-at",
            "1:1:0:sigkill",
        ],
        script=WORKERS / "restart_worker.py",
    )
    assert job.returncode == 0, job.explain()
    starts = job.of("start")
    assert len(starts) == 2 * gpus, job.explain()
    for start in starts:
        local_rank = start["env"]["LOCAL_RANK"]
        assert (start["device"], start["backend"]) == (f"cuda:{local_rank}", "nccl")
    assert {s["env"]["TORCHELASTIC_RESTART_COUNT"] for s in starts} == {"0", "1"}
    assert len({d["digest"] for d in job.of("done")}) == 1
