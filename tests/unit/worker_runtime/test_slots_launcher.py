"""``python -m elasticjob.worker_runtime.agents.slot_supervisor``: one process per slot of a pod."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elasticjob.library_env import (
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_GLOO_SOCKET_IFNAME,
    ENV_NCCL_SOCKET_IFNAME,
)
from elasticjob.wire.messages import ExitAnswer
from elasticjob.worker_contract import (
    ENV_BACKEND,
    ENV_BIND_ADDRESS,
    ENV_HOROVOD_HOSTNAME,
    ENV_HOROVOD_LOCAL_RANK,
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_RENDEZVOUS_URL,
    ENV_START_SERVER_AFTER,
    ENV_TOKEN,
    ENV_TORCH_LOCAL_RANK,
    ENV_WARM_START,
    RESTART_AGENT_MODULE,
    WorkerConfig,
)
from elasticjob.worker_runtime.agents import slot_supervisor
from tests.support.rendezvous_http import TOKEN_A, Cluster, started_cluster
from tests.support.rendezvous_jobs import W2

SLOTS = [sys.executable, "-m", "elasticjob.worker_runtime.agents.slot_supervisor"]


def test_every_slot_runs_with_its_local_rank(tmp_path: Path) -> None:
    script = f"import os; open(r'{tmp_path}/' + os.environ['{ENV_LOCAL_RANK}'], 'w').close()"
    done = subprocess.run(
        [*SLOTS, "3", "--", sys.executable, "-c", script], timeout=120, check=False
    )
    assert done.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]


def test_every_slot_gets_horovods_and_torchruns_launch_variables(tmp_path: Path) -> None:
    names = [ENV_HOROVOD_HOSTNAME, ENV_HOROVOD_LOCAL_RANK, ENV_TORCH_LOCAL_RANK]
    script = (
        "import os\n"
        f"slot = os.environ['{ENV_LOCAL_RANK}']\n"
        f"values = [os.environ[n] for n in {names!r}]\n"
        f"open(r'{tmp_path}/' + slot, 'w').write(' '.join(values))\n"
    )
    env = {**os.environ, ENV_HOSTNAME: "pod-a"}
    done = subprocess.run(
        [*SLOTS, "2", "--", sys.executable, "-c", script], env=env, timeout=120, check=False
    )
    assert done.returncode == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "0": "pod-a 0 0",
        "1": "pod-a 1 1",
    }


def test_the_first_failing_slot_takes_the_others_down() -> None:
    script = (
        "import os, time\n"
        f"if os.environ['{ENV_LOCAL_RANK}'] == '1': raise SystemExit(3)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [*SLOTS, "2", "--", sys.executable, "-c", script], timeout=120, check=False
    )
    assert done.returncode == 3
    assert time.monotonic() - started < 60, "the sleeping slot was not stopped"


def test_usage_errors_are_refused() -> None:
    done = subprocess.run(
        [*SLOTS, "two", "--", "true"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "usage" in done.stderr


RUNTIME_OF_A_SLOT = """
import json, os, sys
import torch
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.runtime import Runtime
runtime = Runtime(WorkerConfig.from_env())  # joins nothing: the rendezvous is never asked
seen = {name: os.environ.get(name) for name in sys.argv[2:]}
seen["device"] = str(runtime.device)
seen["current"] = torch.cuda.current_device() if runtime.device.type == "cuda" else None
with open(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"]), "w") as out:
    json.dump(seen, out)
"""
SEEN = [
    ENV_LOCAL_RANK,
    ENV_HOROVOD_LOCAL_RANK,
    ENV_TORCH_LOCAL_RANK,
    ENV_GLOO_SOCKET_IFNAME,
    ENV_NCCL_SOCKET_IFNAME,
]


def pod_env(backend: str, **extra: str) -> dict[str, str]:
    """A worker container's environment as the operator writes it (the rendezvous service is
    never reached: the slots only construct their runtime)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    return env | {
        ENV_RENDEZVOUS_URL: "http://127.0.0.1:9",
        ENV_JOB: "ns.gpu",
        ENV_TOKEN: "token",
        ENV_HOSTNAME: "gpu-worker-a",
        ENV_BIND_ADDRESS: "127.0.1.9",
        ENV_LOCAL_RANK: "0",
        ENV_BACKEND: backend,
        **extra,
    }


def run_pod(tmp_path: Path, slots: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", RUNTIME_OF_A_SLOT, str(tmp_path), *SEEN]
    return subprocess.run(
        [*SLOTS, str(slots), "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_each_slot_has_its_local_rank_device_and_the_interface_of_the_pod_ip(
    tmp_path: Path,
) -> None:
    done = run_pod(tmp_path, 3, pod_env("gloo", **{ENV_NCCL_SOCKET_IFNAME: "ib0"}))
    assert done.returncode == 0, done.stderr
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()}
    assert seen == {
        str(slot): {
            ENV_LOCAL_RANK: str(slot),
            ENV_HOROVOD_LOCAL_RANK: str(slot),
            ENV_TORCH_LOCAL_RANK: str(slot),
            ENV_GLOO_SOCKET_IFNAME: "lo",  # the interface of the bind address
            ENV_NCCL_SOCKET_IFNAME: "ib0",  # the user's choice stays
            "device": "cpu",
            "current": None,
        }
        for slot in range(3)
    }


def test_nccl_slots_without_gpus_fail_at_init_naming_the_resource(tmp_path: Path) -> None:
    done = run_pod(tmp_path, 2, pod_env("nccl", **{ENV_CUDA_VISIBLE_DEVICES: ""}))
    assert done.returncode != 0
    assert "no CUDA device is visible" in done.stderr and "nvidia.com/gpu" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_slots_each_get_their_own_gpu(tmp_path: Path) -> None:
    slots = min(torch.cuda.device_count(), 4)
    done = run_pod(tmp_path, slots, pod_env("nccl"))
    assert done.returncode == 0, done.stderr
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()}
    assert {slot: (s["device"], s["current"]) for slot, s in seen.items()} == {
        str(k): (f"cuda:{k}", k) for k in range(slots)
    }
    # One slot more than the pod's GPUs: that slot fails at init and takes the pod down.
    done = run_pod(tmp_path, slots + 1, pod_env("nccl"))
    assert done.returncode != 0 and f"slot {slots} has no GPU of its own" in done.stderr


def reporting_env(cluster: Cluster) -> dict[str, str]:
    """The environment of host-a's pod of job-a, whose supervisor reports to ``cluster``."""
    return pod_env("gloo") | {
        ENV_RENDEZVOUS_URL: cluster.service.url,
        ENV_JOB: "job-a",
        ENV_TOKEN: TOKEN_A,
        ENV_HOSTNAME: W2.hostname,
    }


async def test_a_failed_slot_is_reported_to_the_jobs_rendezvous_at_once() -> None:
    """The pod's credential speaks for its slots: the service hears which slot ended and how,
    while the supervisor takes the pod down."""
    async with started_cluster() as cluster:
        cluster.job_a.readmit([W2])  # host-a's slot 1, as its driver does before launching it
        env = reporting_env(cluster)
        script = (
            "import os, time\n"
            f"if os.environ['{ENV_LOCAL_RANK}'] == '1': os.kill(os.getpid(), 9)\n"
            "time.sleep(600)\n"
        )
        pod = await asyncio.create_subprocess_exec(
            *SLOTS, "2", "--", sys.executable, "-c", script, env=env
        )
        assert await asyncio.wait_for(pod.wait(), 120) == 128 + 9
        assert cluster.listener_a.exits == [(W2, -9)]


@pytest.mark.parametrize(
    ("as_file", "warm"),
    [
        pytest.param(True, "torch", id="forked-from-the-pods-start-server"),
        pytest.param(False, "cold", id="a-command-that-cannot-start-warm"),
    ],
)
async def test_a_failed_slot_the_driver_restarts_starts_again_beside_the_others(
    tmp_path: Path, as_file: bool, warm: str
) -> None:
    """The driver answers the report with a restart (``slot_loss.py``): the supervisor starts
    a fresh process in the slot, leaves the other slot running, and the pod succeeds once
    every slot has. A command of a script file restarts forked from the pod's start server:
    torch is imported before its first line; another restarts cold."""
    async with started_cluster() as cluster:
        cluster.job_a.readmit([W2])
        cluster.listener_a.exit_answer = ExitAnswer(restart=True, reason="told to")
        env = reporting_env(cluster) | {ENV_START_SERVER_AFTER: "0"}
        script = (
            "import os, pathlib, sys, time\n"
            f"slot = os.environ['{ENV_LOCAL_RANK}']\n"
            f"runs = pathlib.Path(r'{tmp_path}') / slot\n"
            "first = not runs.exists()\n"
            "warm = 'torch' if 'torch' in sys.modules else 'cold'\n"
            "with runs.open('a') as log: log.write(warm + '\\n')\n"
            # A slot that restarts warm fails once the pod's start server (its supervisor's
            # other child) runs.
            "def server_runs():\n"
            "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "        try:\n"
            "            status = open(f'/proc/{pid}/status').read()\n"
            "            command = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
            "        except OSError:\n"
            "            continue  # it ended meanwhile\n"
            "        if f'PPid:\\t{os.getppid()}\\n' in status and b'warm_interp' in command:\n"
            "            return True\n"
            "    return False\n"
            f"while {as_file} and slot == '1' and first and not server_runs():\n"
            "    time.sleep(0.05)\n"
            "if slot == '1' and first: os.kill(os.getpid(), 9)\n"
            "other = runs.parent / '1'\n"
            "while slot == '0' and (not other.exists() or len(other.read_text().split()) < 2):\n"
            "    time.sleep(0.05)  # slot 0 lives on until the restarted slot 1 ran\n"
        )
        program = tmp_path / "slot.py"
        program.write_text(script)
        command = [str(program)] if as_file else ["-c", script]
        pod = await asyncio.create_subprocess_exec(
            *SLOTS, "2", "--", sys.executable, *command, env=env, stderr=subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(pod.communicate(), 120)
        assert pod.returncode == 0, stderr.decode()
        assert cluster.listener_a.exits == [(W2, -9)]
        runs = {slot: (tmp_path / slot).read_text().split() for slot in ("0", "1")}
        assert runs == {"0": ["cold"], "1": ["cold", warm]}, (runs, stderr.decode())
        assert "slot 1 ended with -9 and starts again: told to" in stderr.decode()
        for line in ("the start server is ready", "slot 1 starts forked from the start server"):
            assert (line in stderr.decode()) is (warm == "torch"), stderr.decode()


@pytest.mark.parametrize(
    ("command", "warm", "forked"),
    [
        pytest.param(["python", "train.py", "--x"], "1", True, id="a-script"),
        pytest.param(["python", "-m", "trainer"], "1", True, id="a-module"),
        pytest.param(["python", "train.py"], "0", False, id="warm-start-off"),
        pytest.param(["python", "-c", "pass"], "1", False, id="a-command-line"),
        pytest.param(["bash", "run.sh"], "1", False, id="not-python"),
        pytest.param(
            ["python", "-m", RESTART_AGENT_MODULE, "--", "python", "t.py"],
            "1",
            False,
            id="a-restart-mode-agent-keeps-its-own",
        ),
    ],
)
def test_which_restarted_slots_fork_from_the_pods_start_server(
    command: list[str], warm: str, forked: bool
) -> None:
    env = pod_env("gloo") | {
        ENV_RENDEZVOUS_URL: "http://127.0.0.1:1",
        ENV_JOB: "job-a",
        ENV_TOKEN: TOKEN_A,
        ENV_HOSTNAME: "host-a",
        ENV_WARM_START: warm,
    }
    config = WorkerConfig.from_env(env)
    assert (slot_supervisor.warm_restarts(command, config) is not None) is forked
    assert slot_supervisor.warm_restarts(command, None) is None, "no service: none restarts"
