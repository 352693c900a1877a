"""A worker that joins its job's rounds and then idles, speaking the rendezvous protocol with
the standard library and the wire names only (no torch): the load of many running jobs on the
operator without the cost of training processes."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from elasticjob import wire


def call(method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30) -> Any:
    job = os.environ[wire.ENV_JOB]
    url = f"{os.environ[wire.ENV_RENDEZVOUS_URL]}{wire.API_PREFIX}/jobs/{job}{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {os.environ[wire.ENV_TOKEN]}",
            wire.PROTOCOL_HEADER: str(wire.PROTOCOL_VERSION),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def main() -> None:
    after_round, seq = 0, 0
    while True:
        try:
            answer = call(
                "POST",
                "/rendezvous",
                {
                    "hostname": os.environ[wire.ENV_HOSTNAME],
                    "local_rank": 0,
                    "address": os.environ[wire.ENV_BIND_ADDRESS],
                    "store_port": 1,
                    "after_round": after_round,
                    "wait_seconds": 20,
                },
            )
            if answer["status"] in ("REMOVED", "FINISHED"):
                return
            if answer["status"] == "ASSIGNED":
                after_round = answer["round"]
                while True:  # idle in the round, following notices like a real worker
                    notices = call("GET", f"/notices?after={seq}&wait=20")
                    seq = notices["latest_seq"]
                    if any(n["kind"] != "ROUND_FAILED" for n in notices["notices"]):
                        break
        except (urllib.error.URLError, OSError):
            time.sleep(1)


if __name__ == "__main__":
    main()
