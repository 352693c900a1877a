"""Worker script of the API tests: exercises the Horovod-compatible API in one job and writes
what every rank observed to ``<out>/rank-<rank>.json``.

The inputs of every collective are simple functions of the rank, so the test can compute the
expected results for any world size; the same script runs under the launcher and standalone
(a world of one, where every collective is an identity). Checks whose expected value needs
torch (reference optimizer steps) are computed here against an independent reference.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from place import place  # beside this script (run by path)
from torch.nn.parallel import DistributedDataParallel

import elasticjob.worker_runtime as hvd
from elasticjob.worker_contract import ENV_LOCAL_RANK
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.elastic import StateHandler, TorchState

Json = dict[str, Any]

CALLS: list[str] = []
"""What the custom state handler and the reset callbacks did, in order."""


# ---- helpers ---------------------------------------------------------------------------


def values(tensor: torch.Tensor) -> Any:
    """A tensor as nested lists of Python numbers (half types widened to float)."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.float()
    return tensor.tolist()


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """Byte-exact fingerprint of a sequence of tensors."""
    h = hashlib.sha256()
    for tensor in tensors:
        h.update(str(tensor.dtype).encode())
        h.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_digest(module: torch.nn.Module) -> str:
    return digest(tensor for _, tensor in sorted(module.state_dict().items()))


def params_digest(module: torch.nn.Module) -> str:
    return digest(p for _, p in sorted(module.named_parameters()))


def buffers_digest(module: torch.nn.Module) -> str:
    return digest(b for _, b in sorted(module.named_buffers()))


def write_results(out: Path, rank: int, results: Json) -> Path:
    """Write ``results`` to ``<out>/rank-<rank>.json`` in one rename (never half written)."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"rank-{rank}.json"
    partial = target.with_suffix(".tmp")
    partial.write_text(json.dumps(results, indent=1, sort_keys=True))
    partial.rename(target)
    return target


def event_log(out: Path) -> Callable[..., None]:
    """``event(kind, **fields)``: appends a JSON line with the wall-clock time, the rank, the
    size and the round to ``<out>/events-<pid>.jsonl`` (the abort scenarios' record)."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"events-{os.getpid()}.jsonl"

    def event(kind: str, **fields: Any) -> None:
        record = {"ev": kind, "time": time.time(), "rank": hvd.rank(), "size": hvd.size()}
        with log.open("a") as file:
            file.write(json.dumps({**record, "round": hvd.current_round(), **fields}) + "\n")

    return event


def run_checks_or_abort(
    values_run: Callable[[Path], None], abort_run: Callable[[Path], None]
) -> None:
    """The main of a worker script with an abort scenario: ``--out DIR`` runs
    ``values_run(DIR)``, ``--out DIR --abort`` runs ``abort_run(DIR)``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--abort", action="store_true", help="run the abort scenario")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.abort:
        abort_run(args.out)
    else:
        values_run(args.out)


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Largest absolute difference between the parameters of two same-shaped modules."""
    with torch.no_grad():
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max(float((p - q).abs().max()) for p, q in pairs)


def describe(obj: Any) -> Any:
    """A JSON form of a nested structure that keeps container kinds and tensor dtypes."""
    if isinstance(obj, torch.Tensor):
        return {
            "tensor": str(obj.dtype),
            "shape": list(obj.shape),
            "device": obj.device.type,
            "values": values(obj),
        }
    if isinstance(obj, dict):
        return {"dict": {str(k): describe(v) for k, v in obj.items()}}
    if isinstance(obj, list):
        return {"list": [describe(v) for v in obj]}
    if isinstance(obj, tuple):
        return {"tuple": [describe(v) for v in obj]}
    return {"py": repr(obj)}


def bn_net(seed: int) -> torch.nn.Sequential:
    """A small net with parameters and buffers of two dtypes (BatchNorm's step counter)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


def mlp(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def batch(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 5, generator=generator), torch.randn(rows, 3, generator=generator)


def mse_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y))


# ---- checks ----------------------------------------------------------------------------


def before_init() -> Json:
    out: Json = {"is_initialized": hvd.is_initialized()}
    for name, call in (("rank", hvd.rank), ("size", hvd.size), ("local_rank", hvd.local_rank)):
        try:
            call()
        except ValueError as exc:
            out[name] = f"ValueError: {exc}"
        else:
            out[name] = "no error"
    return out


def topology() -> Json:
    return {
        "hostname": basics.current().slot.hostname,
        "env_local_rank": os.environ.get(ENV_LOCAL_RANK),
        **place(),
        "device": str(hvd.device()),
    }


def allreduce_checks(r: int) -> Json:
    x = torch.tensor([r + 1.0, 2.0 * r - 1.0, -3.0 * r])
    before = values(x)
    xi = torch.tensor([r * r + 1, 10 - 3 * r, -r], dtype=torch.int64)
    out: Json = {
        "default": values(hvd.allreduce(x)),
        "average_false": values(hvd.allreduce(x, average=False)),
        "sum": values(hvd.allreduce(x, op=hvd.Sum)),
        "min": values(hvd.allreduce(x, op=hvd.Min)),
        "max": values(hvd.allreduce(x, op=hvd.Max)),
        "product": values(hvd.allreduce(x, op=hvd.Product)),
        "f64_average": values(hvd.allreduce(x.double(), op=hvd.Average)),
        "input_after": values(x),
        "input_before": before,
        "sum_pre2_post025": values(
            hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
        ),
        "avg_pre3_post05": values(hvd.allreduce(x, prescale_factor=3.0, postscale_factor=0.5)),
    }
    for name, op in (("sum", hvd.Sum), ("min", hvd.Min), ("max", hvd.Max), ("avg", hvd.Average)):
        result = hvd.allreduce(xi, op=op)
        out[f"int_{name}"] = values(result)
        out[f"int_{name}_dtype"] = str(result.dtype)
    i32 = hvd.allreduce(xi.int(), op=hvd.Sum)
    out["int32_sum"], out["int32_sum_dtype"] = values(i32), str(i32.dtype)

    inplace = x.clone()
    returned = hvd.allreduce_(inplace, op=hvd.Sum)
    out["inplace_is_same"] = returned is inplace
    out["inplace"] = values(inplace)
    strided = torch.arange(6.0).reshape(2, 3).t() * (r + 1)
    hvd.allreduce_(strided)
    out["inplace_strided"] = values(strided)
    return out


def allgather_checks(r: int) -> Json:
    rows = (2, 0, 3)[r % 3]
    grid = torch.tensor([[100.0 * r + 10 * i + j for j in range(2)] for i in range(rows)])
    grid = grid.reshape(rows, 2)
    ints = torch.arange(r + 1) + 10 * r
    gathered = hvd.allgather(grid)
    gathered_ints = hvd.allgather(ints)
    return {
        "grid": values(gathered),
        "grid_shape": list(gathered.shape),
        "ints": values(gathered_ints),
        "ints_dtype": str(gathered_ints.dtype),
    }


def broadcast_checks(r: int, n: int) -> Json:
    root = n - 1
    t = torch.tensor([float(r), 2.0 * r, 7.0])
    copied = hvd.broadcast(t, root_rank=root)
    inplace = torch.full((2, 3), r, dtype=torch.int64)
    returned = hvd.broadcast_(inplace, root_rank=root)
    payload = {"rank": r, "blob": "x" * (1000 * (r + 1)), "nested": [r, (r, "t")]}
    received = hvd.broadcast_object(payload, root_rank=root)
    every = hvd.allgather_object({"rank": r, "items": list(range(50 * r)), "tag": "t" * r})
    return {
        "root": root,
        "copy": values(copied),
        "input_after": values(t),
        "inplace": values(inplace),
        "inplace_is_same": returned is inplace,
        "object": {
            "rank": received["rank"],
            "blob_len": len(received["blob"]),
            "nested": repr(received["nested"]),
        },
        "object_default_root": hvd.broadcast_object(f"from-{r}"),
        "allgather_object": [
            [o["rank"], len(o["items"]), o["items"][-1:], o["tag"]] for o in every
        ],
    }


def warm_batchnorm(model: torch.nn.Module, r: int) -> None:
    """Make the BatchNorm buffers rank-specific (running stats and the step counter)."""
    model.train()
    generator = torch.Generator().manual_seed(50 + r)
    with torch.no_grad():
        for _ in range(r + 1):
            model(torch.randn(6, 4, generator=generator))


def broadcast_parameters_checks(r: int, n: int) -> Json:
    whole = bn_net(100 + r)
    warm_batchnorm(whole, r)
    whole_before = state_digest(whole)
    hvd.broadcast_parameters(whole.state_dict(), root_rank=0)

    root = min(1, n - 1)
    named = bn_net(200 + r)
    warm_batchnorm(named, r)
    params_before, buffers_before = params_digest(named), buffers_digest(named)
    hvd.broadcast_parameters(named.named_parameters(), root_rank=root)
    return {
        "state_dict_before": whole_before,
        "state_dict_after": state_digest(whole),
        "named_root": root,
        "named_params_before": params_before,
        "named_params_after": params_digest(named),
        "named_buffers_before": buffers_before,
        "named_buffers_after": buffers_digest(named),
    }


def optimizer_state_checks(r: int) -> Json:
    out: Json = {}
    for kind in ("sgd", "adam"):
        model = mlp(300)
        opt: torch.optim.Optimizer
        if kind == "sgd":
            opt = torch.optim.SGD(
                model.parameters(), lr=0.1 if r == 0 else 0.5 + r, momentum=0.9 if r == 0 else 0.1
            )
            keys = ["momentum_buffer"]
        else:
            opt = torch.optim.Adam(
                model.parameters(),
                lr=0.01 if r == 0 else 0.5 + r,
                betas=(0.8, 0.9) if r == 0 else (0.5, 0.5),
            )
            keys = ["exp_avg", "exp_avg_sq", "step"]
        if r == 0:  # only the root has optimizer state
            for step in range(2):
                opt.zero_grad()
                mse_step(model, *batch(7 + step, 4))
                opt.step()
        state_before = len(opt.state)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        params = list(model.parameters())
        group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        buffers = [opt.state.get(p, {}).get(key) for p in params for key in keys]
        present = [b for b in buffers if isinstance(b, torch.Tensor)]
        out[kind] = {
            "state_len_before": state_before,
            "state_len_after": len(opt.state),
            "buffers": digest(present) if len(present) == len(buffers) else "missing",
            "steps": [float(b) for b in present[2::3]] if kind == "adam" else [],
            "hyper": repr(sorted(group.items())),
            "lr": opt.param_groups[0]["lr"],
        }
        # The same next step everywhere: identical results only if every buffer belongs to
        # the right parameter.
        opt.zero_grad()
        mse_step(model, *batch(99, 4))
        opt.step()
        out[kind]["params_after_step"] = params_digest(model)
    return out


def broadcast_state_checks(r: int) -> Json:
    if r == 0:
        state: Any = {
            "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) + 0.5,
            "f64": torch.tensor([0.125, -2.5], dtype=torch.float64),
            "i64": torch.tensor([-(2**40), 7]),
            "i32": torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
            "u8": torch.tensor([0, 255], dtype=torch.uint8),
            "bool": torch.tensor([True, False, True]),
            "f16": torch.tensor([0.5, -1.25], dtype=torch.float16),
            "bf16": torch.tensor([1.5], dtype=torch.bfloat16),
            "scalar": torch.tensor(3.25),
            "empty": torch.zeros(0, 4),
            "list": [1, "two", torch.tensor([3.0])],
            "tuple": (torch.tensor([4, 5]), None, 6.5),
            "nested": {"deep": {"x": torch.full((2, 2), 9.0), "tag": "leaf"}},
            "py": {"int": 7, "float": 0.25, "str": "s", "none": None},
        }
    else:  # non-root ranks pass a different structure: only the root's counts
        state = {"unrelated": torch.tensor([r]), "py": r}
    result = hvd.broadcast_state(state, root_rank=0)
    ordered: Any = OrderedDict([("b", torch.tensor([r])), ("a", torch.tensor([2.0 * r]))])
    ordered_result = hvd.broadcast_state({"ordered": ordered}, root_rank=0)["ordered"]
    return {
        "result": describe(result),
        "ordered_type": type(ordered_result).__name__,
        "ordered_keys": list(ordered_result),
        "ordered": describe(dict(ordered_result)),
    }


class Point(NamedTuple):
    x: torch.Tensor
    label: str


def namedtuple_check() -> Json:
    """Root's half of ``broadcast_state`` on a named tuple (run only in a world of one: a root
    that fails before its first collective would leave the other ranks waiting)."""
    try:
        result = hvd.broadcast_state({"p": Point(torch.tensor([1.0]), "a")}, root_rank=0)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "type": type(result["p"]).__name__, "label": result["p"].label}


def distributed_optimizer_checks(r: int) -> Json:
    """One run per variant: two steps on per-rank batches of different sizes, against a plain
    optimizer stepping on the average (or sum) of every rank's gradient."""
    out: Json = {}
    variants: dict[str, dict[str, Any]] = {
        "average": {},
        "predivide": {"gradient_predivide_factor": 2.0},
        "fp16": {"compression": hvd.Compression.fp16},
        "sum": {"op": hvd.Sum},
    }
    for name, options in variants.items():
        model = mlp(42)
        reference = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(),
            **options,
        )
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        ref_scheduler = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        lrs, ref_lrs = [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(2):
                x, y = batch(1000 * step + r, 2 + r)
                opt.zero_grad()
                mse_step(model, x, y)
                opt.step()
                ref_opt.zero_grad()
                mse_step(reference, x, y)
                for p in reference.parameters():
                    assert p.grad is not None
                    every = hvd.allgather(p.grad.unsqueeze(0))
                    p.grad = every.sum(0) if name == "sum" else every.mean(0)
                ref_opt.step()
                scheduler.step()
                ref_scheduler.step()
                lrs.append(opt.param_groups[0]["lr"])
                ref_lrs.append(ref_opt.param_groups[0]["lr"])
        out[name] = {
            "is_sgd": isinstance(opt, torch.optim.SGD),
            "class_name": type(opt).__name__,
            "max_diff": max_diff(model, reference),
            "moved": max_diff(model, mlp(42)),
            "params": params_digest(model),
            "lrs": lrs,
            "ref_lrs": ref_lrs,
            "warnings": [str(w.message) for w in caught],
        }
    return out


def object_state_checks(r: int) -> Json:
    s: Any = hvd.elastic.ObjectState(epoch=r, items=[r], name=f"rank-{r}")
    s.epoch = 10 + r
    s.items.append(100)
    s.commit()
    s.epoch = 99
    s.items.append(5)
    s.name = "changed"
    s.restore()
    restored = {"epoch": s.epoch, "items": list(s.items), "name": s.name}
    s.items.append(7)
    s.restore()
    restored_twice = list(s.items)
    s.epoch = 20 + r
    s.sync()
    synced = {"epoch": s.epoch, "items": list(s.items), "name": s.name}
    s.epoch = 55
    s.restore()
    return {
        "restored": restored,
        "restored_twice_items": restored_twice,
        "synced": synced,
        "restored_after_sync_epoch": s.epoch,
    }


class Counter:
    """A user type with its own state handler."""

    def __init__(self, count: int) -> None:
        self.count = count


class CounterHandler(StateHandler):
    """Restores a :class:`Counter` in place (the default handler would replace the object)."""

    value: Counter

    def state_dict(self) -> int:
        CALLS.append("handler.state_dict")
        return self.value.count

    def load_state_dict(self, saved: int) -> None:
        self.value.count = saved
        CALLS.append("handler.load_state_dict")

    def sync(self) -> None:
        self.value.count = hvd.broadcast_object(self.value.count, root_rank=0)
        CALLS.append("handler.sync")

    def on_reset(self) -> None:
        CALLS.append("handler.on_reset")


def torch_state_checks(r: int) -> Json:
    TorchState.register_handler(Counter, CounterHandler)
    CALLS.clear()
    model = bn_net(500 + r)
    warm_batchnorm(model, r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    counter = Counter(5 + r)
    state = TorchState(model=model, optimizer=opt, counter=counter, epoch=r, batch=0)
    committed = state_digest(model)
    state.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.param_groups[0]["lr"] = 9.0
    counter.count = 1000
    state.epoch, state.batch = 77, 3
    state.restore()
    restored = {
        "model_is_committed": state_digest(model) == committed,
        "model_same_object": state.model is model,
        "lr": opt.param_groups[0]["lr"],
        "counter_same_object": state.counter is counter,
        "count": counter.count,
        "epoch": state.epoch,
        "batch": state.batch,
    }
    state.sync()
    synced = {
        "model": state_digest(model),
        "committed_before": committed,
        "lr": opt.param_groups[0]["lr"],
        "count": counter.count,
        "epoch": state.epoch,
        "counter_same_object": state.counter is counter,
    }
    return {"restored": restored, "synced": synced, "calls": list(CALLS)}


def elastic_ddp_checks(r: int, n: int) -> Json:
    """``elastic.run`` with a DistributedDataParallel model: DDP wraps the model on the
    round's default group, so a reset callback rebuilds the wrapper on the new group. Two
    steps, then a forced re-form of the same world, then two more steps."""
    CALLS.clear()
    inner = mlp(900 + r)  # different on every rank: DDP starts from rank 0's weights
    ddp = [DistributedDataParallel(inner)]
    first_wrapper = ddp[0]
    opt = torch.optim.SGD(inner.parameters(), lr=0.05)
    state = TorchState(model=inner, optimizer=opt, counter=Counter(0), step=0)
    rounds: list[int] = []

    def rebuild_ddp() -> None:
        CALLS.append(f"rebuild_ddp(size={hvd.size()})")
        ddp[0] = DistributedDataParallel(inner)

    def second() -> None:
        CALLS.append("second")

    def third() -> None:
        CALLS.append("third")

    state.register_reset_callbacks([rebuild_ddp, second])
    state.register_reset_callbacks([third])
    interrupted = [False]

    @hvd.elastic.run
    def train(state: TorchState) -> int:
        rounds.append(hvd.current_round())
        while state.step < 4:
            x, y = batch(5000 + 10 * state.step + r, 4)
            opt.zero_grad()
            mse_step(ddp[0], x, y)
            opt.step()
            state.step += 1
            state.commit()
            if state.step == 2 and not interrupted[0]:
                # Every rank at the same step, as after an agreed host update: the group
                # is re-formed with the same workers and live state.
                interrupted[0] = True
                raise hvd.HostsUpdatedInterrupt()
        return int(state.step)

    steps = train(state)

    # Equal batch sizes: DDP's average of per-rank mean gradients is the full-batch mean.
    reference = mlp(900)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(4):
        parts = [batch(5000 + 10 * step + q, 4) for q in range(n)]
        ref_opt.zero_grad()
        mse_step(reference, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        ref_opt.step()
    return {
        "steps": steps,
        "rounds": rounds,
        "calls": list(CALLS),
        "wrapper_rebuilt": ddp[0] is not first_wrapper,
        "params": params_digest(inner),
        "max_diff": max_diff(inner, reference),
        "moved": max_diff(inner, mlp(900)),
    }


def run() -> Json:
    """This rank's results, from before init to after shutdown."""
    torch.set_num_threads(1)
    results: Json = {"before_init": before_init()}
    hvd.init()
    runtime = basics.current()
    round_after_first_init = hvd.current_round()
    hvd.init()
    results["init_twice"] = {
        "same_runtime": basics.current() is runtime,
        "same_round": hvd.current_round() == round_after_first_init,
    }
    results["topology"] = topology()
    r, n = hvd.rank(), hvd.size()
    results["rank"] = r
    results["allreduce"] = allreduce_checks(r)
    results["allgather"] = allgather_checks(r)
    results["broadcast"] = broadcast_checks(r, n)
    results["broadcast_parameters"] = broadcast_parameters_checks(r, n)
    results["optimizer_state"] = optimizer_state_checks(r)
    results["broadcast_state"] = broadcast_state_checks(r)
    if n == 1:
        results["namedtuple"] = namedtuple_check()
    results["distributed_optimizer"] = distributed_optimizer_checks(r)
    results["object_state"] = object_state_checks(r)
    results["torch_state"] = torch_state_checks(r)
    results["elastic_ddp"] = elastic_ddp_checks(r, n)
    results["end_round"] = hvd.current_round()
    hvd.shutdown()
    results["after_shutdown"] = before_init()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    args = parser.parse_args()
    results = run()
    target = write_results(args.out, results["rank"], results)
    print(f"wrote {target.name}")


if __name__ == "__main__":
    main()
