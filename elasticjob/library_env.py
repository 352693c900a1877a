"""Variables of the libraries under a worker process (Python, Gloo, NCCL, CUDA, torch's
allocator) that ``elasticjob-run`` and the operator set or read, and the defaults they give
a worker process unless its environment already names the variable.

Torch-free: the launcher, the operator and the worker runtime all import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

ENV_PYTHONUNBUFFERED: Final = "PYTHONUNBUFFERED"
"""Set by ``elasticjob-run``: worker output reaches the launcher line by line."""
ENV_GLOO_SOCKET_IFNAME: Final = "GLOO_SOCKET_IFNAME"
ENV_NCCL_SOCKET_IFNAME: Final = "NCCL_SOCKET_IFNAME"
"""The network interface of Gloo's and NCCL's traffic: set by ``elasticjob-run
--network-interface``, else by the worker runtime (``worker_runtime/rounds/interfaces.py``)."""
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
"""Read, never set: the devices a worker process sees (see ``worker_runtime/rounds/devices.py``)."""
ENV_TORCH_HUGE_PAGES: Final = "THP_MEM_ALLOC_ENABLE"
"""torch's switch for transparent huge pages under its CPU tensors (see :data:`WORKER_DEFAULTS`)."""


@dataclass(frozen=True)
class WorkerDefault:
    """A variable every worker process gets unless its environment names it."""

    variable: str
    value: str
    meaning: str
    """What it does, for the docs' table (``docs/worker-runtime.md``)."""


WORKER_DEFAULTS: Final = (
    WorkerDefault(
        ENV_TORCH_HUGE_PAGES,
        "1",
        "torch's CPU allocator puts each tensor of 2 MB and more on transparent huge pages "
        "(read at the process's first allocation: set it where the process starts). The kernel "
        "then faults in, zeroes and frees that memory 2 MB at a time instead of 4 KB: a killed "
        "worker of a few GB is gone (its exit seen by its launcher and its peers) in a tenth of "
        "the time, and an HSDP job of 100 M parameters on 2 cores resumed 0.65-0.67 s after a "
        "pod's loss, against 0.96-1.22 s without. It "
        "needs the kernel's `transparent_hugepage` at `madvise` or `always` (at `never` it changes "
        "nothing); a tensor just over a multiple of 2 MB may hold up to 2 MB more resident "
        "memory. `0` turns it off.",
    ),
)
"""What every worker process gets unless its environment (the launcher's, the pod template's
``env``) sets the variable, to any value."""


def with_worker_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with each of :data:`WORKER_DEFAULTS` it does not name."""
    return {**{d.variable: d.value for d in WORKER_DEFAULTS}, **environ}
