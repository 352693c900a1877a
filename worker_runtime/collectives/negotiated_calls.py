"""The records of the collective negotiation (``negotiation.py``): a rank's submitted call
(:class:`NegotiatedCall`) and join (:class:`JoinWork`), how a call is described
(:func:`describe`) and judged with the joined ranks left out (:func:`problem`), and what a
joined rank issues to take part in the others' allreduces (:data:`SERVERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call, mismatch
from elasticjob.worker_runtime.exceptions import CollectiveMismatchError

Issued = tuple[Sequence[Any], Callable[[], Any]]
"""The works of an issued collective, and the function that gives its output once they are
done."""
Start = Callable[[Sequence[Call], dist.ProcessGroup], Issued]
"""Issues an agreed collective on the negotiated group, given every rank's call: returns its
works and the function that gives its output once they are done."""
Server = Callable[[Call, dist.ProcessGroup, "torch.device | None"], Issued]
"""Issues a joined rank's part of a collective the others called (``call`` is one of theirs):
zeros of its dtypes and shapes."""
SERVERS: dict[str, Server] = {}
"""The collectives a joined rank takes part in, by kind (filled by ``reduce.py``)."""
JOIN_SUPPORTED = ("allreduce", "grouped_allreduce")


@dataclass(eq=False, kw_only=True)
class FutureWork:
    """A work for ``RoundGroup.wait`` that completes with its future."""

    future: torch.futures.Future[object] = field(default_factory=torch.futures.Future)

    def get_future(self) -> torch.futures.Future[object]:
        return self.future

    def wait(self) -> bool:
        self.future.wait()
        return True

    def is_completed(self) -> bool:
        return self.future.done()


@dataclass(eq=False)
class NegotiatedCall(FutureWork):
    """A submitted collective: a work (for ``RoundGroup.wait``) that completes once the
    agreed collective's data has moved, or at once with a mismatch."""

    name: str
    key: str
    call: Call
    start: Start
    named: bool
    """Named by the script (its calls are remembered: see ``negotiation.py``)."""
    previous: list[Call | None] | None = None
    """Every rank's agreed call of this name last time (None: a rank that had joined), if
    the name has one."""
    problem: str | None = None
    finish: Callable[[], Any] | None = None

    def result(self) -> Any:
        """The collective's output once :meth:`wait` returned; raises on a mismatch."""
        if self.problem is not None:
            raise CollectiveMismatchError(self.problem)
        assert self.finish is not None
        return self.finish()


@dataclass(eq=False)
class JoinWork(FutureWork):
    """This rank's join: completes once every rank has joined; ``last`` is then the rank
    that joined last."""

    last: int = -1


def disagreement(name: str, calls: Sequence[Call | None]) -> str | None:
    """Why the calls of the ranks that have not joined (``calls``: None for a joined rank)
    cannot be carried out together (:func:`mismatch`), or why the joined ones cannot take
    part (Horovod's words), or None."""
    present = [call for call in calls if call is not None]
    problem = mismatch(name, present)
    if problem is None and len(present) < len(calls) and present[0].kind not in JOIN_SUPPORTED:
        kind = present[0].kind.replace("_", " ").capitalize()
        problem = f"{kind} is not supported with Join at this time"
        problem += f" (collective {name!r}; no data was exchanged)"
    return problem


def settle(future: torch.futures.Future[object], done: torch.futures.Future[Any]) -> None:
    try:
        for part in done.value():
            part.value()
    except (RuntimeError, dist.DistError) as exc:
        future.set_exception(exc)
        return
    future.set_result(None)


def hold(_held: object, _done: torch.futures.Future[Any]) -> None:
    """Keeps what it was given (a joined rank's zeros) until the collective is done."""


def describe(kind: str, tensors: Sequence[torch.Tensor], **fields: Any) -> Call:
    """This rank's :class:`Call` of the collective ``kind`` on ``tensors`` (a scalar counts
    as one row)."""
    return Call(
        kind=kind,
        dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in tensors),
        shapes=tuple(tuple(t.shape) if t.dim() else (1,) for t in tensors),
        **fields,
    )
