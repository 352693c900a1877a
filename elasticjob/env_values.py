"""Numbers read from the worker contract's environment variables, with an error naming the
variable when one is malformed. Torch-free: both the front ends' checkpoint policy and the
worker runtime's config read their numbers through it."""

from __future__ import annotations

import math
from collections.abc import Mapping


def env_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """The finite number of seconds >= 0 in ``environ[name]`` (unset or empty: ``default``).

    Raises :class:`ValueError` naming the variable when the value is not one."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {raw!r}")
    return value


def env_whole(environ: Mapping[str, str], name: str, default: int, *, least: int) -> int:
    """The whole number >= ``least`` in ``environ[name]`` (unset or empty: ``default``).

    Raises :class:`ValueError` naming the variable when the value is not one."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {raw!r}")
    return value
