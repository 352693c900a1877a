"""What this runtime was built with, and the script-controlled timeline, as in Horovod's basics.

There is no MPI, DDL, oneCCL or ROCm build here: their queries answer False
(``mpi_threads_supported`` too, where Horovod would raise without MPI). Gloo, NCCL and CUDA
are whatever the installed torch provides.

``start_timeline(path)`` records this process's activity (rounds joined, resets, commits,
the collectives it waited on) into a Chrome-trace JSON file, as Horovod's does; as in Horovod,
where the coordinator writes the timeline, only rank 0 writes it (the call is a no-op on the
other ranks). ``mark_cycles`` is accepted and has no effect (there are no cycles here).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current, is_initialized
from elasticjob.worker_runtime.diagnostics import timeline


def mpi_built() -> bool:
    """Whether MPI support was built in: never."""
    return False


def mpi_enabled() -> bool:
    """Whether MPI is in use: never."""
    return False


def mpi_threads_supported() -> bool:
    """Whether MPI multi-threading is supported: False (no MPI)."""
    return False


def gloo_built() -> bool:
    """Whether the installed torch has the Gloo backend."""
    return bool(dist.is_gloo_available())


def gloo_enabled() -> bool:
    """Whether this process's collectives run on Gloo (False before ``init()``)."""
    return is_initialized() and current().group.backend == "gloo"


def nccl_built() -> int:
    """The NCCL version code (``major * 10000 + minor * 100 + patch``) of the installed
    torch, or 0 without NCCL."""
    if not dist.is_nccl_available():
        return 0
    major, minor, patch = torch.cuda.nccl.version()[:3]  # type: ignore[no-untyped-call]
    return int(major) * 10000 + int(minor) * 100 + int(patch)


def cuda_built() -> bool:
    """Whether the installed torch was built with CUDA."""
    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def rocm_built() -> bool:
    """Whether ROCm support was built in: not by this runtime."""
    return False


def ddl_built() -> bool:
    """Whether IBM DDL support was built in: never."""
    return False


def ccl_built() -> bool:
    """Whether oneCCL support was built in: never."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording this process's timeline into the Chrome-trace JSON file ``file_path``
    (on rank 0 only; see the module docstring). Raises ``ValueError`` before ``init()``."""
    del mark_cycles
    if current().slot.rank == 0:
        timeline.start_file(Path(file_path))


def stop_timeline() -> None:
    """Stop recording the timeline and complete its file. Raises ``ValueError`` before
    ``init()``."""
    current()
    timeline.stop_file()
