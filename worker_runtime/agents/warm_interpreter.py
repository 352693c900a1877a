"""A start server: a Python interpreter with torch imported that forks a start of a script
per request (``start_server.py`` is its client and says why).

    python warm_interpreter.py --serve FD

It runs by its path, so that it needs nothing but the standard library and, if it can
import it, torch. It imports torch, then reads starts from the ``SOCK_SEQPACKET`` socket
``FD``: each a JSON message ``{"id"}`` carrying four descriptors, the start's standard input,
output and error, and a file of the start as JSON (``argv``, ``env``, ``cwd``, and ``module``
for ``python -m``; a file, since an environment can outgrow a socket's buffer). Per start it forks
a child, which takes a process session of its own, dies with the server
(``PR_SET_PDEATHSIG``), takes the start's streams, environment, directory and ``sys.argv``,
and runs the script as ``python script.py`` or ``python -m module`` would, as ``__main__``,
an uncaught exception told from the script's first frame. The server answers ``{"id",
"pid"}`` once the child is forked (``{"id", "error"}`` when it cannot fork) and ``{"pid",
"exit"}`` once the child ended (negative: the signal that ended it); the end of the socket's
input ends it.

A child starts as a fresh interpreter would but for what the server did before the fork: torch
and ``torch._dynamo`` are imported, and the string hash seed is the server's (Python's and
NumPy's random generators are seeded anew). The variables a start's environment may differ
in from the server's are those nothing reads at import (the clients' rule: a worker's or a
start's place in the job); a start whose other variables differ (such as
``OMP_NUM_THREADS``, which the OpenMP runtime reads when torch loads) starts cold. A script
that sets ``OMP_NUM_THREADS`` itself before importing torch gets that many threads here too;
other variables torch reads at import that a script sets itself (``TORCH_DISTRIBUTED_DEBUG``,
``TORCH_LOGS``) have no effect in a warm start: such a script starts cold (``elasticjob-run
--no-warm-start``, ``warmStart: false``).
"""

import sys

# Run by path, this file's folder (the worker runtime's modules) would come first on the
# module path of torch's imports and of the script's: take it off before anything is imported.
del sys.path[0]

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import importlib  # noqa: E402
import importlib.machinery  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

_MODULES = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
"""What a torch script imports (``torch._dynamo`` is imported by ``DistributedDataParallel``'s
constructor and ``torch.compile``: a second of the start on its own)."""


def _import_torch() -> None:
    """Import what a torch script imports; a server without torch still saves the
    interpreter's start."""
    for name in _MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            return


def _follow_thread_count(event: str, args: tuple[object, ...]) -> None:
    """An audit hook: a script that sets ``OMP_NUM_THREADS`` itself before it imports torch
    gets that many threads, as it would in a fresh interpreter (where OpenMP reads the
    variable when torch loads; here torch is loaded already)."""
    if event != "os.putenv":
        return
    with contextlib.suppress(Exception):  # an audit hook must never fail the script's call
        key, value = (a.decode() if isinstance(a, bytes) else str(a) for a in args)
        torch = sys.modules.get("torch")
        if key == "OMP_NUM_THREADS" and value.isdigit() and torch is not None:
            # At load torch takes no more threads than the process may use CPUs.
            torch.set_num_threads(max(1, min(int(value), len(os.sched_getaffinity(0)))))


def _run_script(path: str) -> None:
    """Run ``path`` as ``python path`` does: in a fresh ``__main__`` module whose
    ``__file__`` is absolute, the script's real folder first on the module path."""
    sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    file = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__file__ = file
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", file)
    main.__spec__ = None
    main.__dict__["__cached__"] = None
    sys.modules["__main__"] = main
    with open(file, "rb") as source:
        code = compile(source.read(), file, "exec")
    exec(code, main.__dict__)


_MESSAGE_BYTES = 4096
"""The largest message a server reads (a start's id; the start comes as a file)."""
_PR_SET_PDEATHSIG = 1


def _serve(channel: socket.socket) -> dict[str, Any] | None:
    """Fork a child per start read from ``channel``, and say its pid and its end; return the
    start in the child, None in the server once ``channel`` ends."""
    children: dict[int, int] = {}  # a child's pidfd -> its pid
    poller = select.poll()
    poller.register(channel, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready != channel.fileno():
                poller.unregister(ready)
                os.close(ready)
                pid = children.pop(ready)
                _, status = os.waitpid(pid, 0)
                _send(channel, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})
                continue
            message, fds, _, _ = socket.recv_fds(channel, _MESSAGE_BYTES, 4)
            if not message:
                return None
            start = _read_start(fds.pop())
            start["id"] = json.loads(message)["id"]
            try:
                pid = os.fork()
            except OSError as exc:
                _close(fds)
                _send(channel, {"id": start["id"], "error": str(exc)})
                continue
            if pid == 0:
                channel.close()
                _close(list(children))
                _become_start(fds)
                return start
            _close(fds)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            _send(channel, {"id": start["id"], "pid": pid})


def _read_start(fd: int) -> dict[str, Any]:
    """The start in the file ``fd``, which it closes."""
    with os.fdopen(fd, "rb") as start:
        start.seek(0)
        return dict(json.loads(start.read()))


def _send(channel: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: the socket's end follows
        channel.send(json.dumps(message).encode())


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _become_start(stdio: list[int]) -> None:
    """In a forked child: a session of its own, death with the server, the start's standard
    streams, and what a fresh interpreter would have anew."""
    server = os.getppid()
    os.setsid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != server:
        os._exit(126)  # the server died before prctl took effect
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    _close([fd for fd in stdio if fd > 2])
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # Python's own generator reseeds itself at fork
        numpy_random.seed()


def _script_traceback(
    kind: type[BaseException], value: BaseException, tb: types.TracebackType | None
) -> None:
    """Print an uncaught exception from the script's first frame on, as ``python script.py``
    prints it (not from this file's and ``runpy``'s frames)."""
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
        tb = tb.tb_next
    sys.__excepthook__(kind, value.with_traceback(tb), tb)


def _run(start: dict[str, Any]) -> None:
    """Take the start's environment, directory and ``sys.argv``, and run its script or
    module as ``__main__``."""
    sys.excepthook = _script_traceback
    os.environ.clear()
    os.environ.update(start["env"])
    os.chdir(start["cwd"])
    sys.argv = list(start["argv"])
    sys.addaudithook(_follow_thread_count)
    module = start.get("module")
    if module is not None:
        sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        _run_script(sys.argv[0])


def main() -> None:
    _import_torch()
    start = _serve(socket.socket(fileno=int(sys.argv[2])))
    if start is not None:
        _run(start)


if __name__ == "__main__":
    main()
