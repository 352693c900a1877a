"""A start server: a Python interpreter with torch imported that forks a start of a script
per request (``start_server.py`` is its client and says why).

    python warm_interpreter.py --serve FD        # one client: the socket FD
    python warm_interpreter.py --listen PATH     # shared: clients connect to PATH

It runs by its path, so that it needs nothing but the standard library and, if it can
import it, torch. It imports torch, then reads starts from a client's ``SOCK_SEQPACKET``
socket: each a JSON message ``{"id"}`` carrying four descriptors, the start's standard input,
output and error, and a file of the start as JSON (``argv``, ``env``, ``cwd``, and ``module``
for ``python -m``; a file, since an environment can outgrow a socket's buffer); with
``--serve`` it says ``{"ready": true}`` first, once torch is imported. Per start it forks
a child, which takes a process session of its own, dies with the server
(``PR_SET_PDEATHSIG``), takes the start's streams, environment, directory and ``sys.argv``,
and runs the script as ``python script.py`` or ``python -m module`` would, as ``__main__``,
an uncaught exception told from the script's first frame. The server answers ``{"id",
"pid"}`` once the child is forked (``{"id", "error"}`` when it cannot fork) and ``{"pid",
"exit"}`` once the child ended (negative: the signal that ended it).

With ``--serve`` the end of the socket's input ends the server (and its children with it).
With ``--listen`` the server outlives its clients: it listens on the Unix socket ``PATH``
(readable by its own user only; a client of another user is refused), greets each client
with ``{"python"}`` (its ``sys.executable``) carrying a file of its environment as JSON,
and SIGKILLs a client's children when that client's socket ends, as a one-client server's
end would; it ends on SIGTERM or SIGINT.

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
import struct  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

_ENVIRONMENT = dict(os.environ)
"""The environment the server was started with (torch's imports may add to it)."""
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


def _serve(channel: socket.socket | None, listener: socket.socket | None) -> dict[str, Any] | None:
    """Fork a child per start read from a client's socket (``channel``, or each client that
    connects to ``listener``), and tell that client its pid and its end; return the start in
    the child, None in the server once its one client (``channel``) is gone."""
    clients: dict[int, socket.socket] = {}
    children: dict[int, tuple[int, socket.socket]] = {}  # a child's pidfd -> its pid, client
    poller = select.poll()
    if channel is not None:
        clients[channel.fileno()] = channel
        poller.register(channel, select.POLLIN)
    if listener is not None:
        poller.register(listener, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if listener is not None and ready == listener.fileno():
                client = _accept(listener)
                if client is not None:
                    clients[client.fileno()] = client
                    poller.register(client, select.POLLIN)
            elif ready in children:
                poller.unregister(ready)
                os.close(ready)
                pid, client = children.pop(ready)
                _, status = os.waitpid(pid, 0)
                if client.fileno() != -1:  # its client is still there
                    _send(client, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})
            elif ready in clients:
                client = clients[ready]
                received = _receive(client)
                if received is None:  # the client is gone (or spoke out of turn)
                    poller.unregister(ready)
                    del clients[ready]
                    if listener is None:
                        return None
                    _kill([pid for pid, of in children.values() if of is client])
                    client.close()
                    continue
                start, fds = received
                try:
                    pid = _fork()
                except OSError as exc:
                    _close(fds)
                    _send(client, {"id": start["id"], "error": str(exc)})
                    continue
                if pid == 0:
                    for fd in [*clients, *children]:
                        os.close(fd)
                    if listener is not None:
                        listener.close()
                    _become_start(fds)
                    return start
                _close(fds)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, client)
                poller.register(pidfd, select.POLLIN)
                _send(client, {"id": start["id"], "pid": pid})


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_inherited_handlers: dict[int, Any] = {}
"""A shared server's stop signals' handlers before it took them, which its children get
back (empty for a one-client server, which takes none)."""


class _Stopped(Exception):
    """A shared server was told to stop (its children die with it)."""


def _stop(_signum: int, _frame: object) -> None:
    raise _Stopped


def _fork() -> int:
    """Fork a child that has the stop signals' handlers the server inherited (no stop
    signal lost to the server's handler in between)."""
    if not _inherited_handlers:
        return os.fork()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            for signum, handler in _inherited_handlers.items():
                signal.signal(signum, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    return pid


def _accept(listener: socket.socket) -> socket.socket | None:
    """A client that connected, greeted with this interpreter and its environment; None for
    a client of another user (refused) or one gone already."""
    try:
        client, _ = listener.accept()
    except OSError:
        return None
    credentials = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    if uid != os.getuid():
        client.close()
        return None
    environment = os.memfd_create("elasticjob-server-env", os.MFD_CLOEXEC)
    try:
        os.write(environment, json.dumps(_ENVIRONMENT).encode())
        hello = json.dumps({"python": sys.executable}).encode()
        socket.send_fds(client, [hello], [environment])
    except OSError:
        client.close()
        return None
    finally:
        os.close(environment)
    return client


def _kill(pids: list[int]) -> None:
    """SIGKILL children whose client is gone, and what they started in their sessions."""
    for pid in pids:
        for kill in (os.killpg, os.kill):  # a child forked a moment ago may not lead one yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def _listen(path: str) -> socket.socket:
    """The listening socket at ``path`` (a socket left there by a server gone is replaced),
    connectable by this user only."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(umask)
    listener.listen(64)
    return listener


def _receive(client: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next start from ``client`` and its standard streams; None at the client's end or
    for what is not a start (whose descriptors it closes)."""
    try:
        message, fds, _, _ = socket.recv_fds(client, _MESSAGE_BYTES, 4)
    except OSError:
        return None
    try:
        if len(fds) != 4:
            raise ValueError(f"{len(fds)} descriptors")
        start_id = json.loads(message)["id"]
        with os.fdopen(fds.pop(), "rb") as start_file:
            start_file.seek(0)
            start = dict(json.loads(start_file.read()))
    except (ValueError, KeyError, TypeError, OSError):
        _close(fds)
        return None
    start["id"] = start_id
    return start, fds


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
    if sys.argv[1] == "--listen":
        start = _serve_shared(sys.argv[2])
    else:
        channel = socket.socket(fileno=int(sys.argv[2]))
        _send(channel, {"ready": True})
        start = _serve(channel, None)
    if start is not None:
        _run(start)


def _serve_shared(path: str) -> dict[str, Any] | None:
    """Serve every client that connects to ``path`` until a stop signal; return the start in
    a child."""
    server, listener = os.getpid(), _listen(path)
    for signum in _STOP_SIGNALS:
        _inherited_handlers[signum] = signal.signal(signum, _stop)
    print(f"start server {server} listening on {path}", flush=True)
    try:
        return _serve(None, listener)
    except _Stopped:
        return None
    finally:
        if os.getpid() == server:  # not in a child, which returns its start
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


if __name__ == "__main__":
    main()
