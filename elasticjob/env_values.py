"""How a field of the worker contract (``elasticjob.worker_contract``) is written to its
environment variable and read back: text, whole numbers, seconds and flags. An unset or empty
variable reads as None (the field's default); a malformed one raises :class:`ValueError`
naming it. Torch-free: the front ends and the worker runtime share it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def seconds_text(seconds: float) -> str:
    """Seconds as the shortest text that reads back as the same number (``30``, ``0.2``)."""
    text = repr(float(seconds))
    return text.removesuffix(".0")


def raw_value(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value; None when it is unset or empty (the field's default)."""
    return environ.get(name) or None


def read_seconds(environ: Mapping[str, str], name: str) -> float | None:
    """The finite number of seconds >= 0 in ``environ[name]`` (None: not given)."""
    raw = raw_value(environ, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {raw!r}")
    return value


def read_whole(environ: Mapping[str, str], name: str, *, least: int) -> int | None:
    """The whole number >= ``least`` in ``environ[name]`` (None: not given)."""
    raw = raw_value(environ, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Variable:
    """A field's variable: its name, and how a value is written and read (unset: None).
    The base is text."""

    name: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def write(self, value: Any) -> dict[str, str]:
        return {self.name: str(value)}

    def read(self, environ: Mapping[str, str]) -> Any:
        return raw_value(environ, self.name)


class Whole(Variable):
    """A whole number >= 0."""

    def read(self, environ: Mapping[str, str]) -> int | None:
        return read_whole(environ, self.name, least=0)


class Seconds(Variable):
    """A finite number of seconds >= 0."""

    def write(self, value: Any) -> dict[str, str]:
        return {self.name: seconds_text(value)}

    def read(self, environ: Mapping[str, str]) -> float | None:
        return read_seconds(environ, self.name)


class Flag(Variable):
    """``1``: yes, anything else: no."""

    def write(self, value: Any) -> dict[str, str]:
        return {self.name: "1" if value else "0"}

    def read(self, environ: Mapping[str, str]) -> bool | None:
        raw = raw_value(environ, self.name)
        return None if raw is None else raw == "1"
