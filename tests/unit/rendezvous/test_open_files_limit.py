"""A serving process raises its open-files limit: about three connections per worker do not
fit in a container runtime's default soft limit of 1,024."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from elasticjob.rendezvous.transport import raise_open_files_limit
returned = raise_open_files_limit()
now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
wanted = min(2**20 if hard == resource.RLIM_INFINITY else hard, 2**20)
print(returned == now == wanted, now, wanted)
"""


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    """In a child process: the test's own limits stay as they are."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert probe.stdout.split()[0] == "True", probe.stdout + probe.stderr
