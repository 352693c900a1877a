"""A spare Python interpreter for a restart-mode script's next start, with torch imported.

Starting a torch script costs seconds before its first line runs (the interpreter, then
``import torch``), and a restart pays them again on every rank. The restart agent therefore
keeps one spare interpreter per slot, started with the script's own interpreter and
environment while the script trains. It runs this file (by its path, so that it needs
nothing but the standard library and, if it can import it, torch), imports torch and waits
for one line on its standard input: the start (JSON: ``argv``, ``env``, ``cwd``, and
``module`` for ``python -m``). It then takes that environment, directory and ``sys.argv``
and runs the script as ``python script.py`` or ``python -m module`` would, as ``__main__``.
An empty standard input (the agent discarded the spare) ends it with status 0.

Only the variables of a start's place in the job (``script_env.PER_START_ENV``: ranks,
sizes, the store's port, the restart count) may differ from the environment the spare was
started with; nothing reads them at import. A start whose other variables differ (such as
``OMP_NUM_THREADS``, which the OpenMP runtime reads when torch loads) is cold.
"""

import sys

# Run by path, this file's folder (the worker runtime's modules) would come first on the
# module path of torch's imports and of the script's: take it off before anything is imported.
del sys.path[0]

import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402

_MODULES = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
"""What a torch script imports (``torch._dynamo`` is imported by ``DistributedDataParallel``'s
constructor and ``torch.compile``: a second of the start on its own)."""


def _import_torch() -> None:
    """Import what a torch script imports; a spare without torch still saves the
    interpreter's start."""
    for name in _MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            return


def main() -> None:
    _import_torch()
    line = sys.stdin.buffer.readline()
    if not line:
        return  # discarded
    start = json.loads(line)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the script's standard input is no pipe of the agent's
    os.close(null)
    os.environ.clear()
    os.environ.update(start["env"])
    os.chdir(start["cwd"])
    sys.argv = list(start["argv"])
    module = start.get("module")
    if module is not None:
        sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
