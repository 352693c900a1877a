"""``make gpu-check`` (``bench/gpu_check.py``) on a machine without CUDA: a clear skip that
succeeds and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the check runs")
def test_without_cuda_the_check_is_skipped_clearly() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "gpu-check: skipped, no CUDA device here" in done.stdout
