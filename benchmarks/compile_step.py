"""A torch.compile'd training step vs an eager one: HF accelerate vs notebook_accel, on CPU.

The same small transformer (pre-norm blocks: attention + MLP, in a ModuleList), the same
data, optimizer and loop, prepared by each Accelerator with ``dynamo_backend`` "no" or the
backend given (default inductor), optionally with regional compilation. Each variant runs
in its own launch (``debug_launcher``, ``--processes`` ranks, default 1: compiling is per
process and the machine has few cores), in rotated order over ``--rounds``, so drifting load
hits all alike; one inductor cache folder for the run, so only the first launch compiles
from scratch (compile time is not measured, only steps).

- time: each step (batch, forward, backward, optimizer step) with ``time.perf_counter``;
  the first ``--warmup`` steps (compiling included) are dropped; the median step of the
  slowest rank per launch, then the median over rounds.
- target: ours compiled within 5% of accelerate's compiled step (ratio <= 1.05).

Run: ``python benchmarks/compile_step.py`` (needs ``pip install accelerate`` and a C
compiler for inductor on CPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def _setup(cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = TinyTransformer(cfg["vocab"], cfg["width"], cfg["heads"], cfg["depth"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    n = cfg["batch"] * cfg["processes"] * cfg["steps"]
    tokens = torch.randint(cfg["vocab"], (n, cfg["seq"] + 1), generator=g)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return model, optimizer, DataLoader(data, batch_size=cfg["batch"])


def _loop(acc: Any, cfg: dict[str, Any]) -> tuple[list[float], float]:
    model, optimizer, loader = acc.prepare(*_setup(cfg))
    times, loss = [], torch.zeros(())
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        x, y = batch
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
    return times, loss.item()


def hf_accelerate(cfg: dict[str, Any]) -> tuple[list[float], float]:
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(
        backend=cfg["backend"], use_regional_compilation=cfg["regional"], mode="default"
    )
    acc = Accelerator(cpu=True, dynamo_plugin=plugin)  # cpu=True: a group on CPU
    try:
        return _loop(acc, cfg)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def notebook_accel(cfg: dict[str, Any]) -> tuple[list[float], float]:
    from notebook_accel import Accelerator, TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend=cfg["backend"], use_regional_compilation=cfg["regional"])
    acc = Accelerator(dynamo_plugin=plugin)
    try:
        return _loop(acc, cfg)
    finally:
        acc.end_training()


RUNNERS = {"HF accelerate": hf_accelerate, "notebook_accel": notebook_accel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--regional", action="store_true", help="regional compilation")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="per process")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    args = parser.parse_args()
    # One cache for the run: the launches after the first find the compiled graphs.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="compile_step_"))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    base = {k: getattr(args, k) for k in ("processes", "threads", "steps", "batch", "seq")}
    base.update(width=args.width, heads=args.heads, depth=args.depth, vocab=args.vocab)
    variants = [(who, mode) for who in RUNNERS for mode in ("eager", "compiled")]
    step_ms: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    final_loss: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        for who, mode in variants[shift:] + variants[:shift]:
            cfg = dict(base, backend="no" if mode == "eager" else args.backend)
            cfg["regional"] = args.regional and mode == "compiled"
            ranks = debug_launcher(
                RUNNERS[who], args=(cfg,), num_processes=args.processes, output="none"
            )
            ms = max(statistics.median(t[args.warmup :]) for t, _ in ranks) * 1e3
            step_ms[(who, mode)].append(ms)
            final_loss[(who, mode)] = ranks[0][1]
    med = {v: statistics.median(ms) for v, ms in step_ms.items()}
    load = os.getloadavg()
    how = f"{args.backend}" + (" (regional)" if args.regional else "")
    print(
        f"\nTransformer {args.depth}x(d={args.width}, {args.heads} heads), seq {args.seq}, "
        f"batch {args.batch}/process, {args.processes} CPU process(es) x {args.threads} "
        f"thread(s); backend {how}; {args.steps - args.warmup} timed steps x {args.rounds} "
        f"rounds; torch {torch.__version__}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"{'':<16}{'eager ms/step':>15}{'compiled ms/step':>18}{'speed-up':>10}{'last loss':>22}")
    for who in RUNNERS:
        eager, compiled = med[(who, "eager")], med[(who, "compiled")]
        losses = f"{final_loss[(who, 'eager')]:.5f}/{final_loss[(who, 'compiled')]:.5f}"
        print(f"{who:<16}{eager:>15.3f}{compiled:>18.3f}{eager / compiled:>9.2f}x{losses:>22}")
    ratio = med[("notebook_accel", "compiled")] / med[("HF accelerate", "compiled")]
    eager_ratio = med[("notebook_accel", "eager")] / med[("HF accelerate", "eager")]
    verdict = "met" if ratio <= 1.05 else "MISSED"
    print(f"ours/accelerate: compiled {ratio:.3f} (target <= 1.05: {verdict}), ", end="")
    print(f"eager {eager_ratio:.3f}")
    print(
        "per-round ms:",
        {f"{w} {m}": [round(x, 3) for x in ms] for (w, m), ms in step_ms.items()},
    )


if __name__ == "__main__":
    main()
