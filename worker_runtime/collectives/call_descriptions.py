"""What a rank asks of a collective (:class:`Call`), and whether the ranks' calls of one name
agree (:func:`mismatch`). Pure and torch-free: the negotiation (``negotiation.py``) exchanges
calls before any data moves, so that ranks that disagree get the same error and the group
stays usable, as Horovod's coordinator does.

The rules are Horovod's (its controller's response construction): every rank must do the
same operation on the same data type; reductions and broadcasts need the same shapes, gathers
and all-to-alls the same shapes but for the first dimension; reductions the same operation
and scale factors; broadcasts the same root; grouped operations the same number of tensors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

Shape = tuple[int, ...]

SAME_SHAPE = frozenset(
    {"allreduce", "grouped_allreduce", "broadcast", "reducescatter", "grouped_reducescatter"}
)
"""Operations whose tensors must have the same shape on every rank."""


@dataclass(frozen=True)
class Call:
    """One rank's call of a collective: what every rank's call of the same name must match.
    A grouped operation lists one dtype and shape per tensor."""

    kind: str
    dtypes: tuple[str, ...]
    shapes: tuple[Shape, ...]
    op: str | None = None
    root: int | None = None
    prescale: float = 1.0
    postscale: float = 1.0
    splits: tuple[int, ...] | None = None
    """An all-to-all's rows for each rank (the receivers learn their counts from it)."""

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Call:
        fields = json.loads(text)
        return cls(
            kind=fields["kind"],
            dtypes=tuple(fields["dtypes"]),
            shapes=tuple(tuple(shape) for shape in fields["shapes"]),
            op=fields["op"],
            root=fields["root"],
            prescale=fields["prescale"],
            postscale=fields["postscale"],
            splits=None if fields["splits"] is None else tuple(fields["splits"]),
        )


def _first_difference(calls: Sequence[Call], field: str) -> tuple[int, object, object] | None:
    """The first rank whose ``field`` differs from rank 0's: (rank, rank 0's, its)."""
    first = getattr(calls[0], field)
    for rank, call in enumerate(calls[1:], start=1):
        value = getattr(call, field)
        if value != first:
            return rank, first, value
    return None


def _shape_mismatch(kind: str, calls: Sequence[Call]) -> str | None:
    for index, shape in enumerate(calls[0].shapes):
        for rank, call in enumerate(calls[1:], start=1):
            other = call.shapes[index]
            tensor = f" (tensor {index})" if len(calls[0].shapes) > 1 else ""
            if kind in SAME_SHAPE:
                if other != shape:
                    return (
                        f"Mismatched {kind} tensor shapes{tensor}: rank 0 sent {list(shape)}, "
                        f"rank {rank} sent {list(other)}"
                    )
            elif len(other) != len(shape):
                return (
                    f"Mismatched {kind} tensor ranks{tensor}: rank 0 sent a tensor of "
                    f"{len(shape)} dimensions, rank {rank} one of {len(other)}"
                )
            elif other[1:] != shape[1:]:
                return (
                    f"Mismatched {kind} tensor shapes{tensor}: every dimension but the first "
                    f"must agree; rank 0 sent {list(shape)}, rank {rank} sent {list(other)}"
                )
    return None


_CALL_CHECKS = (("kind", "Mismatched operations: rank 0 did {0}, rank {r} did {1}"),)
_TENSOR_CHECKS = (
    ("dtypes", "Mismatched data types: rank 0 sent {0}, rank {r} sent {1}"),
    ("op", "Mismatched reduction operations: rank 0 asked for {0}, rank {r} for {1}"),
    ("root", "Mismatched {kind} root ranks: rank 0 named root {0}, rank {r} named root {1}"),
    ("prescale", "Mismatched prescale factors: rank 0 gave {0}, rank {r} gave {1}"),
    ("postscale", "Mismatched postscale factors: rank 0 gave {0}, rank {r} gave {1}"),
)


def mismatch(name: str, calls: Sequence[Call]) -> str | None:
    """Why the ranks' calls of the collective ``name`` (``calls[r]`` is rank r's) cannot be
    carried out together, or None when they agree."""
    kind = calls[0].kind
    for field, template in _CALL_CHECKS:
        difference = _first_difference(calls, field)
        if difference is not None:
            return _named(name, template.format(*map(_shown, difference[1:]), r=difference[0]))
    for rank, call in enumerate(calls[1:], start=1):
        if len(call.shapes) != len(calls[0].shapes):
            return _named(
                name,
                f"Mismatched number of tensors in grouped {kind}: rank 0 sent "
                f"{len(calls[0].shapes)}, rank {rank} sent {len(call.shapes)}",
            )
    for field, template in _TENSOR_CHECKS:
        difference = _first_difference(calls, field)
        if difference is not None:
            shown = map(_shown, difference[1:])
            return _named(name, template.format(*shown, r=difference[0], kind=kind))
    shapes = _shape_mismatch(kind, calls)
    return None if shapes is None else _named(name, shapes)


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _named(name: str, message: str) -> str:
    return f"{message} (collective {name!r}; no data was exchanged)"
