"""A round's group whose other member went silent (real Gloo over loopback, the peer a second
process), for the tests of what waits on such a group."""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from torch.distributed import TCPStore

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.training import step_weight
from tests.support.worker_env import standalone_env

SILENT_PEER_TIMEOUT = datetime.timedelta(seconds=40)

PEER = """
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                      timeout=datetime.timedelta(seconds=30))
dist.init_process_group("gloo", store=dist.PrefixStore("round-1/", store), rank=1,
                        world_size=2, timeout=datetime.timedelta(seconds=40))
dist.new_group()  # the negotiated collectives' group, which every member forms too
print("formed", flush=True)
sys.stdin.read()  # silent, sockets open, until the test closes stdin
"""


@pytest.fixture
def group() -> Iterator[RoundGroup]:
    """A round's group of its own (a module may give its own, e.g. the runtime's)."""
    group = RoundGroup("gloo", torch.device("cpu"))
    yield group
    group.destroy()


@pytest.fixture
def runtime_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundGroup]:
    """The standalone runtime's round group (a world of one until a test re-forms it, e.g.
    with ``silent_peer`` when a module's ``group`` returns it)."""
    standalone_env(monkeypatch)
    hvd.init()
    yield basics.current().group
    step_weight.set_source(None)
    hvd.shutdown()


@pytest.fixture
def silent_peer(group: RoundGroup) -> Iterator[subprocess.Popen[str]]:
    """Forms ``group`` as rank 0 of two members with a peer that then goes silent."""
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=SILENT_PEER_TIMEOUT
    )
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(store.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # torch's warnings (a store retried on a busy machine)
        text=True,
    )
    try:
        group.configure(store, "round-1/", 0, 2, SILENT_PEER_TIMEOUT)
        assert peer.stdout is not None
        said: list[str] = []
        for line in peer.stdout:
            if line.strip() == "formed":
                break
            said.append(line)
        else:
            raise AssertionError(f"the peer never formed the group:\n{''.join(said)}")
        yield peer
    finally:
        peer.kill()
        peer.wait(30)
