"""Quiet stages for a first run: one line per stage on the terminal, the tools' own output in
a log file per stage.

A stage says what it does and where its log goes when it starts, how long it has run every
:data:`PROGRESS_EVERY_S` seconds while it runs (with how many lines its tools wrote so far, so
progress shows from trouble), and how long it took when it ends. When it fails, the last
:data:`TAIL_LINES` lines of its log and the log's path are printed. Nothing of the tools'
output is lost: it is all in the log.

Two ways in, both from the standard library only (``make`` runs the first before the
virtual environment exists):

- ``python3 -m devcluster.stages NAME LOG -- COMMAND...`` runs a command as a stage;
- ``with stage(name, log):`` runs Python code as a stage: while it runs, this process's
  standard output and error (``sys.stdout`` and ``sys.stderr``, and file descriptors 1 and 2,
  so the subprocesses it starts too) go to the log, and the stage's lines to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, TextIO

PROGRESS_EVERY_S: Final = 15.0
TAIL_LINES: Final = 30


class StageFailed(RuntimeError):
    """A stage's command failed; its log's tail was printed."""


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _lines(log: Path) -> int:
    try:
        with log.open("rb") as text:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: text.read(1 << 16), b""))
    except OSError:
        return 0


def tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``log`` (none if it cannot be read)."""
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


class _Progress:
    """Prints the stage's progress to ``out`` every ``every_s`` seconds from a thread."""

    def __init__(self, name: str, log: Path, out: TextIO, every_s: float) -> None:
        self._name, self._log, self._out, self._every_s = name, log, out, every_s
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stage {name}", daemon=True)

    def __enter__(self) -> _Progress:
        self._say(f"==> {self._name} (log: {self._log})")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _say(self, line: str) -> None:
        print(line, file=self._out, flush=True)

    def _run(self) -> None:
        while not self._done.wait(self._every_s):
            lines = _lines(self._log)
            self._say(f"    ... {self.elapsed} so far, {lines:,} lines logged")

    @property
    def elapsed(self) -> str:
        return _elapsed(time.monotonic() - self._started)

    def finished(self) -> None:
        self._say(f"    done in {self.elapsed}")

    def failed(self, why: str) -> None:
        self._say(f"    FAILED after {self.elapsed}: {why}; the last lines of {self._log}:")
        for line in tail(self._log):
            self._say(f"    | {line}")
        self._say(f"    (the whole log: {self._log})")


def run_stage(
    name: str, log: Path, command: Sequence[str], *, every_s: float = PROGRESS_EVERY_S
) -> None:
    """Run ``command`` as a stage (see the module docstring). Raises :class:`StageFailed`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink, _Progress(name, log, sys.stdout, every_s) as progress:
        try:
            code = subprocess.run(
                command,
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            ).returncode
        except OSError as exc:
            progress.failed(f"{command[0]} could not start: {exc}")
            raise StageFailed(name) from exc
        if code != 0:
            progress.failed(f"exit status {code}")
            raise StageFailed(name)
        progress.finished()


@contextlib.contextmanager
def stage(name: str, log: Path, *, every_s: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """Run the body as a stage (see the module docstring); an exception it raises is
    reported with the log's tail and raised again."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")  # this run's output only; both writers below append to it
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        with (
            log.open("ab") as sink,
            log.open("a", buffering=1, errors="replace") as text,
            _Progress(name, log, terminal, every_s) as progress,
        ):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                    yield
            except BaseException as exc:
                sys.stdout.flush()
                sys.stderr.flush()
                progress.failed(f"{type(exc).__name__}: {exc}")
                raise
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            progress.finished()
    finally:
        terminal.close()
        for fd in saved:
            os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m devcluster.stages NAME LOG -- COMMAND...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[2] != "--":
        print("usage: python3 -m devcluster.stages NAME LOG -- COMMAND...", file=sys.stderr)
        return 2
    try:
        run_stage(args[0], Path(args[1]), args[3:])
    except StageFailed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
