"""The device of each slot (``devices.py``): a table of the decision's branches."""

from __future__ import annotations

import pytest
import torch

from elasticjob.worker_runtime.rounds.devices import DeviceError, DevicePlan, device_for_slot

CPU = DevicePlan(torch.device("cpu"), None)


def cuda(index: int, physical: str | None = None) -> DevicePlan:
    return DevicePlan(torch.device("cuda", index), index, physical)


@pytest.mark.parametrize(
    ("local_rank", "backend", "count", "visible", "expected"),
    [
        pytest.param(0, "gloo", 0, None, CPU, id="gloo-without-gpus"),
        pytest.param(3, "gloo", 2, "0,1", CPU, id="gloo-leaves-gpus-to-the-script"),
        pytest.param(0, "nccl", 1, None, cuda(0), id="one-slot-one-gpu"),
        pytest.param(1, "nccl", 4, None, cuda(1), id="slot-k-gets-cuda-k"),
        pytest.param(3, "nccl", 4, "4,5,6,7", cuda(3, "7"), id="named-by-visible-entry"),
        pytest.param(1, "nccl", 2, "GPU-a1, GPU-b2", cuda(1, "GPU-b2"), id="uuid-entries"),
        pytest.param(2, "nccl", 1, "5", cuda(0, "5"), id="launcher-gave-own-device"),
        pytest.param(0, "nccl", 2, "", cuda(0), id="unparsed-entries-name-nothing"),
    ],
)
def test_device_for_slot(
    local_rank: int, backend: str, count: int, visible: str | None, expected: DevicePlan
) -> None:
    assert device_for_slot(local_rank, backend, count, visible) == expected


@pytest.mark.parametrize(
    ("local_rank", "count", "visible", "message"),
    [
        pytest.param(0, 0, None, "no CUDA device is visible.*nvidia.com/gpu", id="no-gpu"),
        pytest.param(0, 0, "", r"CUDA_VISIBLE_DEVICES=''", id="hidden-by-visible"),
        pytest.param(2, 2, None, "slot 2 has no GPU of its own: 2 visible", id="fewer-gpus"),
        pytest.param(1, 1, None, "slot 1 has no GPU.*slotsPerWorker", id="shared-single-gpu"),
        pytest.param(1, 1, "0,1", "slot 1 has no GPU", id="one-seen-of-two-named"),
    ],
)
def test_nccl_without_a_device_of_its_own_is_a_clear_error(
    local_rank: int, count: int, visible: str | None, message: str
) -> None:
    with pytest.raises(DeviceError, match=message):
        device_for_slot(local_rank, "nccl", count, visible)
