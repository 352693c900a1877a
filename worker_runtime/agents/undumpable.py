"""Keep the pod's credential out of the script's reach in restart mode: the restart agent holds it
in its environment, and a process of the same user may read another's
``/proc/<pid>/environ`` (and attach a debugger to it) unless that process is not dumpable.

:func:`make_undumpable` clears the agent's dumpable flag (``prctl(PR_SET_DUMPABLE, 0)``): its
``/proc`` files then belong to root, and the script it starts, run by ``execve`` with an
environment without the credential, is dumpable as usual (the kernel sets the flag again on
``execve``), so the script's own debugging and core dumps are as they were."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Final

logger = logging.getLogger(__name__)

PR_SET_DUMPABLE: Final = 4


def make_undumpable() -> bool:
    """Clear this process's dumpable flag; False where the system has no ``prctl`` (not
    Linux) or refuses it (logged)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        logger.warning("could not hide the agent's environment: errno %d", ctypes.get_errno())
        return False
    return True
