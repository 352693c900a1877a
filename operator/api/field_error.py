"""A rule an ElasticJob breaks, named by its field: what admission and the operator report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """A rule a spec breaks: the field's path (``spec.minReplicas``) and what is wrong."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"
