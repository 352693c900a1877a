"""The round's store as its groups see it (``rounds/abortable_store.py``): a wait ends as soon
as the round fails, and a group formed on it is a working group."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import HashStore, PrefixStore

from elasticjob.worker_runtime.rounds.abortable_store import AbortableStore


def test_a_wait_returns_once_its_keys_are_set() -> None:
    store = AbortableStore(HashStore(), lambda: False)
    threading.Timer(0.05, store.set, args=("key", "value")).start()
    assert store.get("key") == b"value"
    store.wait(["key"], datetime.timedelta(seconds=1))


def test_a_wait_gives_up_as_soon_as_the_round_fails() -> None:
    failed = threading.Event()
    store = AbortableStore(PrefixStore("round-1/", HashStore()), failed.is_set)
    threading.Timer(0.1, failed.set).start()
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="the round failed"):
        store.get("never-set")
    assert time.monotonic() - started < 5.0


def test_a_wait_ends_at_its_timeout() -> None:
    inner = HashStore()
    inner.set_timeout(datetime.timedelta(seconds=60))
    store = AbortableStore(inner, lambda: False)
    assert store.timeout == datetime.timedelta(seconds=60)  # the wrapped store's by default
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.wait(["never-set"], datetime.timedelta(seconds=0.1))
    store.set_timeout(datetime.timedelta(seconds=0.1))
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.get("never-set")


def test_a_group_formed_on_it_works() -> None:
    store = AbortableStore(PrefixStore("round-1/", HashStore()), lambda: False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        total = torch.ones(3)
        dist.all_reduce(total, group=dist.new_group([0]))
        assert total.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
