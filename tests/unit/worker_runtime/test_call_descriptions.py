"""Whether the ranks' calls of one collective agree: Horovod's rules, one row per mismatch
(and the agreements that must pass)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from elasticjob.worker_runtime.collectives.call_descriptions import Call, mismatch

REDUCE = Call("allreduce", ("float32",), ((2, 3),), op="sum")
GATHER = Call("allgather", ("float32",), ((2, 3),))
BROADCAST = Call("broadcast", ("float32",), ((2, 3),), root=0)
GROUPED = Call("grouped_allreduce", ("float32", "int64"), ((2,), (3,)), op="average")


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([REDUCE, REDUCE], None, id="same-reduction"),
        pytest.param([REDUCE, REDUCE, REDUCE], None, id="three-same"),
        pytest.param([GATHER, replace(GATHER, shapes=((5, 3),))], None, id="gather-first-dim"),
        pytest.param([GROUPED, GROUPED], None, id="same-group"),
        pytest.param(
            [REDUCE, replace(REDUCE, kind="allgather")],
            "Mismatched operations: rank 0 did allreduce, rank 1 did allgather",
            id="operation",
        ),
        pytest.param(
            [REDUCE, replace(REDUCE, dtypes=("int32",))],
            "Mismatched data types: rank 0 sent float32, rank 1 sent int32",
            id="dtype",
        ),
        pytest.param(
            [REDUCE, REDUCE, replace(REDUCE, shapes=((3, 2),))],
            "Mismatched allreduce tensor shapes: rank 0 sent [2, 3], rank 2 sent [3, 2]",
            id="reduce-shape-third-rank",
        ),
        pytest.param(
            [REDUCE, replace(REDUCE, op="max")],
            "Mismatched reduction operations: rank 0 asked for sum, rank 1 for max",
            id="op",
        ),
        pytest.param(
            [REDUCE, replace(REDUCE, prescale=2.0)],
            "Mismatched prescale factors: rank 0 gave 1.0, rank 1 gave 2.0",
            id="prescale",
        ),
        pytest.param(
            [REDUCE, replace(REDUCE, postscale=0.5)],
            "Mismatched postscale factors: rank 0 gave 1.0, rank 1 gave 0.5",
            id="postscale",
        ),
        pytest.param(
            [BROADCAST, replace(BROADCAST, root=1)],
            "Mismatched broadcast root ranks: rank 0 named root 0, rank 1 named root 1",
            id="root",
        ),
        pytest.param(
            [GATHER, replace(GATHER, shapes=((2, 4),))],
            "Mismatched allgather tensor shapes: every dimension but the first must agree",
            id="gather-later-dim",
        ),
        pytest.param(
            [GATHER, replace(GATHER, shapes=((2, 3, 1),))],
            "Mismatched allgather tensor ranks: rank 0 sent a tensor of 2 dimensions",
            id="gather-rank",
        ),
        pytest.param(
            [GROUPED, replace(GROUPED, dtypes=("float32",), shapes=((2,),))],
            "Mismatched number of tensors in grouped grouped_allreduce: rank 0 sent 2",
            id="grouped-count",
        ),
        pytest.param(
            [GROUPED, replace(GROUPED, shapes=((2,), (4,)))],
            "Mismatched grouped_allreduce tensor shapes (tensor 1)",
            id="grouped-member-shape",
        ),
    ],
)
def test_calls_agree_or_the_mismatch_is_named(calls: list[Call], expected: str | None) -> None:
    found = mismatch("grads", calls)
    if expected is None:
        assert found is None
        return
    assert found is not None and found.startswith(expected), found
    assert found.endswith("(collective 'grads'; no data was exchanged)")


def test_a_call_travels_unchanged() -> None:
    call = Call("alltoall", ("bfloat16",), ((4, 2),), splits=(1, 3))
    assert Call.decode(call.encode()) == call
