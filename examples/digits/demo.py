"""`make demo-local`: an elastic job on this machine, under the local launcher, that grows,
shrinks and survives a killed worker while it trains.

It runs ``elasticjob-run`` on ``train.py`` with ``discover_hosts.sh`` reading a hosts file,
echoes everything the job prints, and as rank 0 reports epochs it
- adds host 127.0.1.3 with 2 slots after the first epoch (scale-out: 3 -> 5 workers),
- removes host 127.0.1.2 once 5 workers train (graceful scale-in: 5 -> 4 workers),
- SIGKILLs a worker of 127.0.1.3 once 4 workers train (failure: its host is blacklisted and
  the survivors roll back to their last commit and go on with 2 workers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from elasticjob.driver.job_record import JobRecordData
from elasticjob.job_timeline import render
from elasticjob.worker_contract import ENV_HOSTNAME, ENV_JOB

HERE = Path(__file__).resolve().parent


def say(message: str) -> None:
    print(f"\n>>> demo: {message}\n", flush=True)


def workers_on(host: str) -> list[int]:
    """Pids of this job's worker processes assigned to ``host`` (from their environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        wanted = {f"{ENV_HOSTNAME}={host}".encode(), f"{ENV_JOB}=digits".encode()}
        if wanted <= set(environ):
            pids.append(int(proc.name))
    return pids


def main() -> int:
    out = Path(tempfile.mkdtemp(prefix="elasticjob-demo-local-"))
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts.txt"
        hosts.write_text("127.0.1.1:2\n127.0.1.2:1\n")
        command = [
            sys.executable, "-m", "elasticjob.launcher.run_command", "--job-name", "digits",
            "-np", "3", "--min-np", "2", "--max-np", "6",
            "--blacklist-cooldown-range", "5", "30", "--job-record", str(out / "digits.json"),
            "--host-discovery-script", str(HERE / "discover_hosts.sh"),
            sys.executable, str(HERE / "train.py"), "--epochs", "12", "--pace", "0.05",
        ]  # fmt: skip
        say(f"starting: hosts {hosts.read_text().split()}")
        job = subprocess.Popen(
            command, env={**os.environ, "HOSTS_FILE": str(hosts)}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert job.stdout is not None
        stage = 0
        for line in job.stdout:
            print(line, end="", flush=True)
            if "]<stdout>:epoch " not in line:
                continue
            if stage == 0:
                say("adding host 127.0.1.3 with 2 slots (scale-out)")
                hosts.write_text("127.0.1.1:2\n127.0.1.2:1\n127.0.1.3:2\n")
                stage = 1
            elif stage == 1 and ", 5 workers," in line:
                say("removing host 127.0.1.2 (graceful scale-in)")
                hosts.write_text("127.0.1.1:2\n127.0.1.3:2\n")
                stage = 2
            elif stage == 2 and ", 4 workers," in line:
                victims = workers_on("127.0.1.3")[:1]
                say(f"killing worker pid {victims} on 127.0.1.3 with SIGKILL (failure)")
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
                stage = 3
        code = job.wait()
        say(f"job exited with {code}")
        record = JobRecordData.model_validate_json((out / "digits.json").read_bytes())
        render(record, out / "digits-timeline.png")
        render(record, out / "digits-timeline.html")
        say(f"goodput {record.goodput:.1%}; the job's timeline: {out / 'digits-timeline.png'}")
        return code


if __name__ == "__main__":
    sys.exit(main())
