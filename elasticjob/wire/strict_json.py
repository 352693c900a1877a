"""Strict JSON bodies: the base of every wire model and the parser the rendezvous service
reads request bodies with.

The models are strict (an integer field takes a JSON integer only, never ``true``, ``"1"`` or
``1.0``; a boolean takes ``true`` or ``false`` only; a float field takes any JSON number),
forbid unknown fields and bound every number, and a body that names a key twice is refused, so
malformed input is refused with a 4xx before it can touch any job's state.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Frozen, no unknown fields; every number and boolean field is strict (``Field(strict=
    True)``), so also Python callers cannot pass ``True`` or ``"1"`` for an integer."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice."""


_Model = TypeVar("_Model", bound=BaseModel)


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKeyError(f"key {key!r} is given more than once")
        found[key] = value
    return found


def parse_json(model: type[_Model], data: bytes | str) -> _Model:
    """Validate JSON ``data`` as ``model`` (strictly, see the module docstring).

    Raises :class:`pydantic.ValidationError` for malformed JSON or a value the model refuses,
    and :class:`DuplicateKeyError` when an object of an otherwise valid body repeats a key."""
    parsed = model.model_validate_json(data, strict=True)
    # Only a body that validated is scanned again: its depth and size are bounded by the model.
    json.loads(data, object_pairs_hook=_refuse_duplicates)
    return parsed
