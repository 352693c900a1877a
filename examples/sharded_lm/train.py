"""Elastic sharded training of a small decoder-only transformer language model with FSDP2, on
synthetic tokens (no download).

The model (token and position embeddings, pre-norm blocks of causal self-attention and an MLP,
a final norm and a head, tied to the token embedding with ``--tie-embeddings``) is sharded
with ``torch.distributed.fsdp.fully_shard``: each block, then the root. The training loop is
a plain FSDP2 loop (AdamW, gradient clipping across shards, optionally bfloat16 compute with
``--mixed-precision``); what makes it elastic is:

- ``hvd.elastic.ShardedState(build, redundancy=...)``: ``build(mesh)`` makes and shards the
  model and its optimizer for every round (each round has a new group); ``state.commit()``
  keeps this rank's shards in host memory with copies on other workers, so when a worker
  dies the survivors rebuild its shards from those copies and reshard onto the new world,
  without a restart and without disk. With ``--hsdp`` the mesh is two-dimensional: each
  pod's slots shard the model and the pods replicate it, so a lost pod moves nothing;
- the loop lives in a function wrapped by ``hvd.elastic.run``;
- ``hvd.elastic.ElasticSampler``: every sequence once per epoch, across failures and resizes.

The data are sequences of a fixed random Markov chain over the vocabulary: each token has
``--branching`` possible successors, equally likely, so the loss falls from ln(vocab) towards
ln(branching) as the model learns the chain.

Run it under the local launcher, e.g. four workers on two loopback hosts:

    elasticjob-run -np 4 --min-np 2 -H 127.0.1.1:2,127.0.1.2:2 \\
        python examples/sharded_lm/train.py --epochs 2

or under the operator, in the worker image (whose working directory holds the examples):

    kubectl apply -f examples/elasticjob-sharded.yaml
"""

from __future__ import annotations

import argparse
import logging
import math
import time

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--tie-embeddings", action="store_true", help="the head is the embedding")
    parser.add_argument("--branching", type=int, default=4, help="successors of each token")
    parser.add_argument("--samples", type=int, default=4096, help="sequences in the dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per worker")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--mixed-precision", action="store_true", help="bfloat16 compute")
    parser.add_argument("--redundancy", type=int, default=1, help="copies of every shard")
    parser.add_argument(
        "--hsdp", action="store_true", help="shard within a pod (its slots), replicate across"
    )
    parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
    parser.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    parser.add_argument("--pace", type=float, default=0.0, help="extra seconds per step, to watch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dim % args.heads:
        parser.error("--dim must be a multiple of --heads")
    return args


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, dim))
        mlp: torch.Tensor = self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))
        return x + mlp


class LanguageModel(nn.Module):
    """A decoder-only transformer: next-token logits for every position."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.tokens = nn.Embedding(args.vocab, args.dim)
        self.positions = nn.Embedding(args.seq_len, args.dim)
        self.blocks = nn.ModuleList(Block(args.dim, args.heads) for _ in range(args.layers))
        self.norm = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab, bias=False)
        if args.tie_embeddings:
            self.head.weight = self.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def init_weights(model: nn.Module, seed: int, shard: int) -> None:
    """Initialize this rank's shards, shard ``shard`` of each parameter, in place (norms to 1
    and 0, matrices normal with std 0.02): no rank ever holds a whole parameter, and the
    replicas of HSDP start alike."""
    generator = torch.Generator().manual_seed(seed + 1000 * shard)
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if "norm" in name:
                local.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                local.normal_(0.0, 0.02, generator=generator)


def markov_dataset(args: argparse.Namespace) -> TensorDataset:
    """``--samples`` sequences of ``--seq-len + 1`` tokens of a seeded random Markov chain,
    with each sequence's index (to count what was trained)."""
    generator = torch.Generator().manual_seed(args.seed)
    successors = torch.randint(args.vocab, (args.vocab, args.branching), generator=generator)
    tokens = torch.empty(args.samples, args.seq_len + 1, dtype=torch.int64)
    tokens[:, 0] = torch.randint(args.vocab, (args.samples,), generator=generator)
    choices = torch.randint(args.branching, (args.samples, args.seq_len), generator=generator)
    for t in range(args.seq_len):
        tokens[:, t + 1] = successors[tokens[:, t], choices[:, t]]
    return TensorDataset(tokens, torch.arange(args.samples))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    hvd.init()

    dataset = markov_dataset(args)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def build(mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model sharded over this round's ``mesh``, and its optimizer."""
        with torch.device("meta"):
            model = LanguageModel(args)
        policy = mixed if args.mixed_precision else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to_empty(device=hvd.device())
        if not state.restoring:  # otherwise the committed state replaces the weights
            init_weights(model, args.seed, mesh.get_local_rank(mesh.ndim - 1))
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.lr, weight_decay=args.weight_decay
        )
        return model, optimizer

    state = hvd.elastic.ShardedState(
        build,
        redundancy=args.redundancy,
        hsdp=args.hsdp,
        sampler=sampler,
        epoch=0,
        batch=0,
        seen=torch.zeros(len(dataset), dtype=torch.int64),
    )

    @hvd.elastic.run
    def train(state: hvd.elastic.ShardedState) -> None:
        assert state.model is not None and state.optimizer is not None
        model, optimizer = state.model, state.optimizer
        if hvd.rank() == 0:
            logger.info(
                "round %d: %d workers, from epoch %d step %d",
                hvd.current_round(), hvd.size(), state.epoch, state.batch,
            )  # fmt: skip
        window = Window(args.seq_len)
        while state.epoch < args.epochs:
            real = state.sampler.num_real_samples
            for batch_idx, (batch, idx) in enumerate(loader):
                first = batch_idx * args.batch_size
                keep = torch.arange(first, first + len(idx)) < real  # padding is not trained
                sequences = batch.to(hvd.device())
                logits = model(sequences[:, :-1])
                losses = nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), sequences[:, 1:].flatten(), reduction="none"
                ).view(len(idx), -1)
                weights = keep.to(losses.device, losses.dtype)[:, None].expand_as(losses)
                loss = (losses * weights).sum() / weights.sum().clamp(min=1.0)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
                state.seen += hvd.allreduce(
                    torch.bincount(idx[keep], minlength=len(dataset)), op=hvd.Sum
                )
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                window.add((losses * weights).sum().item(), int(weights.sum().item()))
                if args.pace:
                    time.sleep(args.pace)
                if state.batch % args.log_every == 0:
                    window.report(state)
                if state.batch % args.commit_every == 0:
                    state.commit()
            if hvd.rank() == 0:
                logger.info(
                    "epoch %d done: %d workers, round %d, every sequence trained exactly "
                    "once: %s",
                    state.epoch, hvd.size(), hvd.current_round(), bool((state.seen == 1).all()),
                )  # fmt: skip
            state.epoch += 1
            state.batch = 0
            state.seen.zero_()
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    hvd.shutdown()


class Window:
    """The loss and throughput since the last log line, summed over every worker."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.restart()

    def restart(self) -> None:
        self.loss_sum = 0.0
        self.tokens = 0
        self.started = time.monotonic()

    def add(self, loss_sum: float, tokens: int) -> None:
        self.loss_sum += loss_sum
        self.tokens += tokens

    def report(self, state: hvd.elastic.ShardedState) -> None:
        """Log the window's mean loss and tokens/s on rank 0 (a collective), then restart it."""
        totals = hvd.allreduce(torch.tensor([self.loss_sum, float(self.tokens)]), op=hvd.Sum)
        loss_sum, tokens = totals.tolist()
        seconds = max(time.monotonic() - self.started, 1e-9)
        if hvd.rank() == 0:
            loss = loss_sum / max(tokens, 1.0)
            logger.info(
                "epoch %d step %d: loss %.4f (perplexity %.2f), %.0f tokens/s, %d workers, "
                "last commit %.1f ms",
                state.epoch, state.batch, loss, math.exp(min(loss, 50.0)), tokens / seconds,
                hvd.size(), state.commit_seconds * 1000,
            )  # fmt: skip
        hvd.report_progress(state.epoch, state.batch, tokens / seconds / self.seq_len)
        self.restart()


if __name__ == "__main__":
    main()
