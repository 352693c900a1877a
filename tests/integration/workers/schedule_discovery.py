"""Discovery script of the multi-process tests: prints the hosts that a schedule gives for the
epoch rank 0 is in (``schedule.json``: {"0": "127.0.1.1:2,127.0.1.2:2", "2": ...}; an epoch
without an entry keeps the previous one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    schedule = {int(k): v for k, v in json.loads(Path(sys.argv[1]).read_text()).items()}
    epoch_file = Path(sys.argv[2])
    epoch = int(epoch_file.read_text() or 0) if epoch_file.exists() else 0
    hosts = schedule[max(e for e in schedule if e <= epoch)]
    for host in hosts.split(","):
        print(host)


if __name__ == "__main__":
    main()
