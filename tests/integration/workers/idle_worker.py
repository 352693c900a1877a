"""Worker script of the launcher fault tests: joins the job, writes its pid to
``<out>/<pid>`` once it has a rank, then idles until it is killed (or orphaned)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import elasticjob.worker_runtime as hvd


def main() -> None:
    hvd.init()
    out = Path(sys.argv[1])
    (out / f"{os.getpid()}.tmp").write_text(str(hvd.rank()))
    (out / f"{os.getpid()}.tmp").rename(out / str(os.getpid()))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
