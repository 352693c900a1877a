"""The Horovod-compatible worker API across real processes.

``api_worker.py``'s ``run`` in the worker-API suite's launcher job (3 processes on the
loopback "hosts" 127.0.1.1 with 2 slots and 127.0.1.2 with 1, Gloo, after the suite's other
parts) and one standalone run of ``api_worker.py`` exercise the whole API; every rank
writes what it observed to a JSON file and the tests below assert on those files. The
collective inputs are simple functions of the rank (repeated here), so every expected value
is computed for the world at hand: the same assertions hold in the world of one, where each
collective must be an identity.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tests.support.job_runs import run_to_end
from tests.support.worker_scripts import (
    RUN_TIMEOUT_S,
    Result,
    api_suite_part,
    launcher,
    run,
    run_standalone,
    same_everywhere,
    section,
)

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
WORKER = HERE / "workers" / "api_worker.py"
UNINITIALIZED = "ValueError: elasticjob.worker_runtime.init() has not been called"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Every rank's results from the worker-API suite's 3-process job on two hosts."""
    return api_suite_part("api", 3, tmp_path_factory)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """The results of the worker script run without a launcher."""
    return run_standalone(WORKER, tmp_path_factory)


@pytest.fixture(params=["cluster", "standalone"])
def world(request: pytest.FixtureRequest) -> list[Result]:
    """The results of either world, indexed by rank."""
    results: list[Result] = request.getfixturevalue(request.param)
    return results


# ---- identity of the process --------------------------------------------------------------


def test_topology_per_host_and_slot(cluster: list[Result]) -> None:
    topo = section(cluster, "topology")
    assert [t["rank"] for t in topo] == [0, 1, 2]
    # rank: (host, local_rank, local_size, cross_rank, cross_size). Local rank 0 runs on both
    # hosts (cross_size 2, the hosts in order); local rank 1 only on the first (cross_size 1).
    expected = {
        0: ("127.0.1.1", 0, 2, 0, 2),
        1: ("127.0.1.1", 1, 2, 0, 1),
        2: ("127.0.1.2", 0, 1, 1, 2),
    }
    for t in topo:
        got = (t["hostname"], t["local_rank"], t["local_size"], t["cross_rank"], t["cross_size"])
        assert got == expected[t["rank"]], t
        assert t["size"] == 3
        assert t["env_local_rank"] == str(t["local_rank"])
        assert t["device"] == "cpu"
    assert same_everywhere([t["round"] for t in topo]) >= 1


def test_standalone_is_a_world_of_one(standalone: list[Result]) -> None:
    (result,) = standalone
    topo = result["topology"]
    assert (topo["rank"], topo["size"], topo["local_rank"], topo["local_size"]) == (0, 1, 0, 1)
    assert (topo["cross_rank"], topo["cross_size"]) == (0, 1)
    reduce = result["allreduce"]
    own = [1.0, -1.0, -0.0]
    for name in ("default", "average_false", "sum", "min", "max", "product", "f64_average"):
        assert reduce[name] == own, name
    assert reduce["int_avg"] == reduce["int_sum"] == [1, 10, 0]
    assert result["allgather"]["grid"] == [[0.0, 1.0], [10.0, 11.0]]
    cast = result["broadcast"]
    assert cast["copy"] == cast["input_after"] == [0.0, 0.0, 7.0]
    assert cast["object"] == {"rank": 0, "blob_len": 1000, "nested": "[0, (0, 't')]"}
    assert cast["allgather_object"] == [[0, 0, [], ""]]


def test_init_twice_is_a_no_op_and_queries_need_init(world: list[Result]) -> None:
    for result in world:
        for when in ("before_init", "after_shutdown"):
            checks = result[when]
            assert checks["is_initialized"] is False
            for name in ("rank", "size", "local_rank"):
                assert checks[name] == UNINITIALIZED, (when, name)
        assert result["init_twice"] == {"same_runtime": True, "same_round": True}


# ---- collectives ----------------------------------------------------------------------


def test_allreduce_ops_dtypes_and_scaling(world: list[Result]) -> None:
    n = len(world)
    xs = [[r + 1.0, 2.0 * r - 1.0, -3.0 * r] for r in range(n)]
    ints = [[r * r + 1, 10 - 3 * r, -r] for r in range(n)]
    sums = [sum(col) for col in zip(*xs, strict=True)]
    int_sums = [sum(col) for col in zip(*ints, strict=True)]
    average = [s / n for s in sums]
    for r, got in enumerate(section(world, "allreduce")):
        assert got["default"] == pytest.approx(average)
        assert got["f64_average"] == pytest.approx(average)
        assert got["average_false"] == got["sum"] == pytest.approx(sums)
        assert got["min"] == [min(col) for col in zip(*xs, strict=True)]
        assert got["max"] == [max(col) for col in zip(*xs, strict=True)]
        assert got["product"] == pytest.approx([math.prod(col) for col in zip(*xs, strict=True)])
        assert got["sum_pre2_post025"] == pytest.approx([s * 2.0 * 0.25 for s in sums])
        assert got["avg_pre3_post05"] == pytest.approx([a * 3.0 * 0.5 for a in average])
        # Integer tensors keep their dtype; the average of integers rounds down.
        assert got["int_sum"] == got["int32_sum"] == int_sums
        assert got["int_min"] == [min(col) for col in zip(*ints, strict=True)]
        assert got["int_max"] == [max(col) for col in zip(*ints, strict=True)]
        assert got["int_avg"] == [s // n for s in int_sums]
        for name in ("sum", "min", "max", "avg"):
            assert got[f"int_{name}_dtype"] == "torch.int64"
        assert got["int32_sum_dtype"] == "torch.int32"
        # allreduce leaves its input alone; allreduce_ works in place, strided tensors too.
        assert got["input_before"] == got["input_after"] == pytest.approx(xs[r])
        assert got["inplace_is_same"] is True
        assert got["inplace"] == pytest.approx(sums)
        mean_scale = sum(q + 1 for q in range(n)) / n
        transposed = [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
        for got_row, row in zip(got["inplace_strided"], transposed, strict=True):
            assert got_row == pytest.approx([v * mean_scale for v in row])


def test_allgather_with_uneven_first_dimensions(world: list[Result]) -> None:
    n = len(world)
    rows = [(2, 0, 3)[r % 3] for r in range(n)]  # rank 1 contributes no row at all
    grid = [[100.0 * r + 10 * i + j for j in range(2)] for r in range(n) for i in range(rows[r])]
    ints = [10 * r + i for r in range(n) for i in range(r + 1)]
    for got in section(world, "allgather"):
        assert got["grid"] == grid
        assert got["grid_shape"] == [sum(rows), 2]
        assert got["ints"] == ints
        assert got["ints_dtype"] == "torch.int64"


def test_broadcast_and_python_objects(world: list[Result]) -> None:
    n = len(world)
    root = n - 1
    for r, got in enumerate(section(world, "broadcast")):
        assert got["root"] == root
        assert got["copy"] == [float(root), 2.0 * root, 7.0]
        assert got["input_after"] == [float(r), 2.0 * r, 7.0], "broadcast changed its input"
        assert got["inplace_is_same"] is True
        assert got["inplace"] == [[root] * 3] * 2
        # The root's payload is the largest: receivers size their buffers from the root.
        assert got["object"] == {
            "rank": root,
            "blob_len": 1000 * (root + 1),
            "nested": f"[{root}, ({root}, 't')]",
        }
        assert got["object_default_root"] == "from-0"
        assert got["allgather_object"] == [
            [q, 50 * q, [50 * q - 1] if q else [], "t" * q] for q in range(n)
        ]


def test_broadcast_parameters_state_dict_and_named_parameters(world: list[Result]) -> None:
    got = section(world, "broadcast_parameters")
    n = len(world)
    if n > 1:  # otherwise the check would be vacuous
        assert len({g["state_dict_before"] for g in got}) == n
        assert len({g["named_params_before"] for g in got}) == n
        assert len({g["named_buffers_before"] for g in got}) == n
    # state_dict(): parameters and buffers (float and int64) all become rank 0's.
    assert same_everywhere([g["state_dict_after"] for g in got]) == got[0]["state_dict_before"]
    # named_parameters() from another root: parameters become the root's, buffers stay.
    root = same_everywhere([g["named_root"] for g in got])
    assert root == min(1, n - 1)
    assert (
        same_everywhere([g["named_params_after"] for g in got]) == got[root]["named_params_before"]
    )
    for g in got:
        assert g["named_buffers_after"] == g["named_buffers_before"]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_broadcast_optimizer_state_fills_fresh_optimizers(world: list[Result], kind: str) -> None:
    got = [g[kind] for g in section(world, "optimizer_state")]
    assert got[0]["state_len_before"] == 4  # two Linear layers: 4 parameters with state
    for g in got[1:]:
        assert g["state_len_before"] == 0, "a non-root optimizer started with state"
    assert [g["state_len_after"] for g in got] == [4] * len(got)
    same_everywhere([g["buffers"] for g in got])  # momentum / exp_avg and exp_avg_sq
    same_everywhere([g["hyper"] for g in got])  # lr, momentum or betas of the root
    assert got[-1]["lr"] == (0.1 if kind == "sgd" else 0.01)
    if kind == "adam":
        assert [g["steps"] for g in got] == [[2.0] * 4] * len(got)
    # The same next step gives the same parameters only if each buffer sits on its parameter.
    same_everywhere([g["params_after_step"] for g in got])


def test_broadcast_state_nested_structure(world: list[Result]) -> None:
    got = section(world, "broadcast_state")
    result = same_everywhere([g["result"] for g in got])["dict"]
    tensors = {
        "f32": ("torch.float32", [2, 3], [[0.5, 1.5, 2.5], [3.5, 4.5, 5.5]]),
        "f64": ("torch.float64", [2], [0.125, -2.5]),
        "i64": ("torch.int64", [2], [-(2**40), 7]),
        "i32": ("torch.int32", [2, 2], [[1, 2], [3, 4]]),
        "u8": ("torch.uint8", [2], [0, 255]),
        "bool": ("torch.bool", [3], [True, False, True]),
        "f16": ("torch.float16", [2], [0.5, -1.25]),
        "bf16": ("torch.bfloat16", [1], [1.5]),
        "scalar": ("torch.float32", [], 3.25),
        "empty": ("torch.float32", [0, 4], []),
    }
    for key, (dtype, shape, values) in tensors.items():
        assert result[key] == {"tensor": dtype, "shape": shape, "device": "cpu", "values": values}
    f32_3 = {"tensor": "torch.float32", "shape": [1], "device": "cpu", "values": [3.0]}
    assert result["list"] == {"list": [{"py": "1"}, {"py": "'two'"}, f32_3]}
    pair = {"tensor": "torch.int64", "shape": [2], "device": "cpu", "values": [4, 5]}
    assert result["tuple"] == {"tuple": [pair, {"py": "None"}, {"py": "6.5"}]}
    deep = result["nested"]["dict"]["deep"]["dict"]
    assert deep["tag"] == {"py": "'leaf'"}
    assert deep["x"]["values"] == [[9.0, 9.0], [9.0, 9.0]]
    assert result["py"] == {
        "dict": {
            "int": {"py": "7"},
            "float": {"py": "0.25"},
            "str": {"py": "'s'"},
            "none": {"py": "None"},
        }
    }
    assert set(result) == {*tensors, "list", "tuple", "nested", "py"}
    ordered = same_everywhere([g["ordered"] for g in got])["dict"]
    assert ordered["b"]["values"] == [0] and ordered["a"]["values"] == [0.0]
    assert same_everywhere([g["ordered_keys"] for g in got]) == ["b", "a"]


def test_broadcast_state_keeps_dict_subclasses(cluster: list[Result]) -> None:
    types = [g["ordered_type"] for g in section(cluster, "broadcast_state")]
    assert types == ["OrderedDict"] * 3


def test_broadcast_state_named_tuple(standalone: list[Result]) -> None:
    assert standalone[0]["namedtuple"] == {"error": None, "type": "Point", "label": "a"}


# ---- DistributedOptimizer ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ["average", "predivide", "fp16", "sum"])
def test_distributed_optimizer_matches_a_step_on_the_reduced_gradient(
    world: list[Result], variant: str
) -> None:
    """Two momentum-SGD steps on per-rank batches of different sizes, with a StepLR scheduler,
    against a plain optimizer stepping on the allgathered gradients' mean (or sum)."""
    got = [g[variant] for g in section(world, "distributed_optimizer")]
    same_everywhere([g["params"] for g in got])
    for g in got:
        assert g["is_sgd"] is True
        assert g["class_name"] == "SGD"
        assert g["max_diff"] < (1e-3 if variant == "fp16" else 1e-5), g
        assert g["moved"] > 1e-2, "the optimizer did not train"
        assert g["lrs"] == g["ref_lrs"] == pytest.approx([0.05, 0.025])
        assert not [w for w in g["warnings"] if "lr_scheduler" in w], g["warnings"]


def test_distributed_optimizer_sum_differs_from_average(cluster: list[Result]) -> None:
    got = cluster[0]["distributed_optimizer"]
    assert got["sum"]["params"] != got["average"]["params"]
    assert got["predivide"]["params"] == got["average"]["params"]


# ---- elastic state ----------------------------------------------------------------------


def test_object_state_commit_restore_sync(world: list[Result]) -> None:
    for r, got in enumerate(section(world, "object_state")):
        assert got["restored"] == {"epoch": 10 + r, "items": [r, 100], "name": f"rank-{r}"}
        assert got["restored_twice_items"] == [r, 100], "restore handed out the snapshot"
        assert got["synced"] == {"epoch": 20, "items": [0, 100], "name": "rank-0"}
        assert got["restored_after_sync_epoch"] == 20, "sync did not commit rank 0's values"


def test_torch_state_commit_restore_sync_with_custom_handler(world: list[Result]) -> None:
    got = section(world, "torch_state")
    rank0_committed = got[0]["synced"]["committed_before"]
    for r, g in enumerate(got):
        assert g["restored"] == {
            "model_is_committed": True,
            "model_same_object": True,
            "lr": pytest.approx(0.1 * (r + 1)),
            "counter_same_object": True,  # restored in place by the registered handler
            "count": 5 + r,
            "epoch": r,
            "batch": 0,
        }
        synced = g["synced"]
        assert synced["model"] == rank0_committed
        assert synced["lr"] == pytest.approx(0.1)
        assert (synced["count"], synced["epoch"], synced["counter_same_object"]) == (5, 0, True)
        # The registered handler did the work: created (snapshot), commit, restore, sync +
        # snapshot.
        assert g["calls"] == [
            "handler.state_dict",
            "handler.state_dict",
            "handler.load_state_dict",
            "handler.sync",
            "handler.state_dict",
        ]


def test_ddp_rebuilt_in_a_reset_callback(world: list[Result]) -> None:
    """DistributedDataParallel on the default group inside ``elastic.run``: two steps, a
    re-form of the same world, the wrapper rebuilt by a reset callback, two more steps. The
    result equals plain SGD on the full batch and is identical on every rank."""
    n = len(world)
    got = section(world, "elastic_ddp")
    same_everywhere([g["params"] for g in got])
    for result, g in zip(world, got, strict=True):
        assert g["steps"] == 4
        first, second = g["rounds"]
        assert second == first + 1 == result["end_round"]
        assert result["topology"]["round"] == first
        assert g["wrapper_rebuilt"] is True
        # Handlers reset first, then the user's callbacks in registration order.
        reset_at = g["calls"].index("handler.on_reset")
        assert g["calls"][reset_at : reset_at + 4] == [
            "handler.on_reset",
            f"rebuild_ddp(size={n})",
            "second",
            "third",
        ]
        assert g["calls"].count("handler.on_reset") == 1
        assert g["max_diff"] < 1e-5, g
        assert g["moved"] > 1e-2


# ---- launcher command line ----------------------------------------------------------------


def test_launcher_accepts_double_dash_before_the_command(tmp_path: Path) -> None:
    script = "import elasticjob.worker_runtime as hvd; hvd.init(); hvd.shutdown()"
    out = tmp_path / "results"
    job = run(
        launcher("-np", "1", "-H", "127.0.1.1:1", "--", sys.executable, "-c", script),
        out,
        timeout_s=90,
    )
    assert job.returncode == 0, job.explain()


# ---- scripts without elastic.run ------------------------------------------------------------


def run_plain_horovod(tmp_path: Path, teardown_s: float, *flags: str) -> tuple[int, str, str]:
    """``plain_horovod_worker.py`` (a script without ``elastic.run``) under the launcher with
    ``flags``, its interpreter's teardown lasting ``teardown_s`` more."""
    script = HERE / "workers" / "plain_horovod_worker.py"
    command = [*launcher(*flags), sys.executable, str(script), "--teardown-s", str(teardown_s)]
    return run_to_end(command, tmp_path, None, RUN_TIMEOUT_S)


def test_a_script_without_elastic_run_succeeds_through_a_slow_teardown(tmp_path: Path) -> None:
    """A non-elastic Horovod script's process stops beating while the interpreter tears down
    (slow on a loaded machine); it told the driver it is ending, so its exit is awaited, not
    its heartbeat: no eviction, the job succeeds. Teardown 5 s, heartbeat timeout 2 s."""
    returncode, stdout, stderr = run_plain_horovod(
        tmp_path, 5, "-np", "2", "-H", "127.0.1.1:2", "--heartbeat-timeout", "2"
    )
    both = f"{stderr}\n--- the workers' output ---\n{stdout}"
    assert returncode == 0, both
    assert "job succeeded: 2 of 2 workers succeeded" in stderr, both
    assert "evicting" not in stderr, both
    assert stdout.count("trained, average 1.0") == 2, both


def test_a_teardown_that_hangs_after_success_is_stopped_and_the_job_succeeds(
    tmp_path: Path,
) -> None:
    """One worker's interpreter never finishes tearing down (a finalizer that blocks, as a
    communicator's shutdown can): it told the driver it succeeded and stopped beating, so the
    driver stops it after the removal grace (``--removal-grace``, 30 s by default, 3 here)
    and the job succeeds. Before, the job waited for that process forever."""
    returncode, stdout, stderr = run_plain_horovod(
        tmp_path, 3600, "-np", "1", "-H", "127.0.1.1:1", "--removal-grace", "3"
    )
    both = f"{stderr}\n--- the workers' output ---\n{stdout}"
    assert returncode == 0, both
    assert "reported SUCCESS and has not exited within 3 s (its teardown hangs)" in stderr, both
    assert "job succeeded: 1 of 1 workers succeeded" in stderr, both
    assert stdout.count("trained, average 1.0") == 1, both
