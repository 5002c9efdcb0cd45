"""A small GPT-style decoder trained with DistributedDataParallel on synthetic tokens.

Start it with ``torchrun --standalone --nproc-per-node N train.py [flags]`` (or plain
``python train.py`` for one process). On a machine with CUDA every rank uses the GPU of its
``LOCAL_RANK`` and NCCL; otherwise ranks run on the CPU with gloo, each with
``cores // ranks`` threads, so that the number of ranks trades threads for data parallelism.

The throughput knobs are flags (the form cubic's job contract renders): ``--micro-batch``,
``--grad-accum``, ``--ddp-bucket-mb``, ``--activation-checkpointing/--no-...``,
``--bf16/--no-bf16`` and ``--nproc-per-node`` (read by ``torchrun``; ignored here). Rank 0
reports ``tokens_per_s`` over the steps after the warm-up with :func:`cubic.job.report`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

try:
    from cubic.job import StepTimer, report
except ImportError:  # run from a checkout without cubic installed: use the repository's
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cubic.job import StepTimer, report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    knobs = p.add_argument_group("throughput knobs (the search space)")
    knobs.add_argument("--micro-batch", type=int, default=1, help="sequences per forward pass")
    knobs.add_argument("--grad-accum", type=int, default=8, help="micro-batches per step")
    knobs.add_argument("--ddp-bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    knobs.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each block's activations in the backward pass",
    )
    knobs.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=False, help="bf16 autocast"
    )
    knobs.add_argument(
        "--nproc-per-node", type=int, default=None, help="ranks per node (read by torchrun)"
    )
    model = p.add_argument_group("model and run length")
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--hidden", type=int, default=256)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--vocab", type=int, default=2048)
    model.add_argument("--seq-len", type=int, default=128)
    model.add_argument("--steps", type=int, default=8, help="optimizer steps in all")
    model.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="steps left out of the throughput (default: CUBIC_WARMUP_STEPS, else 2)",
    )
    model.add_argument("--seed", type=int, default=0)
    model.add_argument(
        "--memory-limit-gib",
        type=float,
        default=None,
        help="cap this process's CUDA allocations (act as a GPU with this much memory)",
    )
    args = p.parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = int(os.environ.get("CUBIC_WARMUP_STEPS") or 2)
    for name in ("micro_batch", "grad_accum", "layers", "hidden", "heads", "vocab", "seq_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.ddp_bucket_mb <= 0:
        p.error("--ddp-bucket-mb must be positive")
    if args.memory_limit_gib is not None and args.memory_limit_gib <= 0:
        p.error("--memory-limit-gib must be positive")
    if args.hidden % args.heads:
        p.error("--heads must divide --hidden")
    if args.warmup_steps < 0 or args.steps <= args.warmup_steps:
        p.error("--steps must exceed --warmup-steps (no step would be timed)")
    return args


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(
        self, *, vocab: int, seq_len: int, layers: int, hidden: int, heads: int, ckpt: bool
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.ckpt = ckpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            if self.ckpt and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln(x))


def setup(memory_limit_gib: float | None = None) -> tuple[torch.device, int, int]:
    """Join the process group; returns (device, rank, world size).

    ``memory_limit_gib`` caps the caching allocator on a GPU, so that a large GPU runs out of
    memory where a smaller one would: the allocator raises the same ``OutOfMemoryError``.
    """
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if memory_limit_gib is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, memory_limit_gib * 2**30 / total), device
            )
    else:
        device = torch.device("cpu")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        torch.set_num_threads(max(1, (cores or os.cpu_count() or 1) // local_world))
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group(backend, device_id=device if cuda else None)
    else:  # a plain `python train.py`: a group of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device, dist.get_rank(), dist.get_world_size()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, rank, world = setup(args.memory_limit_gib)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = GPT(
        vocab=args.vocab,
        seq_len=args.seq_len,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        ckpt=args.activation_checkpointing,
    ).to(device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.ddp_bucket_mb,
    )
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1 + rank)  # a shard per rank
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    tokens_per_step = args.micro_batch * args.seq_len * args.grad_accum * world
    timer = StepTimer(warmup=args.warmup_steps)
    loss_value = math.nan
    for _ in range(args.steps):
        start = time.perf_counter()
        for micro in range(args.grad_accum):
            batch = torch.randint(
                args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen, device=device
            )
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            last = micro == args.grad_accum - 1
            with ddp.no_sync() if not last else contextlib.nullcontext(), autocast:
                logits = ddp(batch[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            (loss / args.grad_accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        loss_value = float(loss.detach())
        timer.record(time.perf_counter() - start, tokens=tokens_per_step)
    if rank == 0:
        extra: dict[str, float] = {
            "world_size": world,
            "tokens_per_step": tokens_per_step,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "loss": loss_value,
            "threads_per_rank": torch.get_num_threads(),
        }
        if device.type == "cuda":
            extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        report({**timer.metrics(), **extra})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
