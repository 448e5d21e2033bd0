"""A torch.compile'd training step vs an eager one: HF accelerate vs notebook_accel, on CPU.

The same small transformer (pre-norm blocks: attention + MLP, in a ModuleList), the same
data, optimizer and loop, prepared by each Accelerator with ``dynamo_backend`` "no" or the
backend given (default inductor), optionally with regional compilation. Both Accelerators run
in one launch per mode (``debug_launcher``, ``--processes`` ranks, default 1: compiling is
per process and the machine has few cores), their steps alternated (order swapped each
step), so drifting load hits both alike; eager and compiled launches alternate over
``--rounds``; one inductor cache folder for the run, so only the first launch compiles
from scratch (compile time is not measured, only steps).

- time: each step (forward, backward, optimizer step; the batch is fetched before) with
  ``time.perf_counter``; the first ``--warmup`` steps (compiling included) are dropped; the
  median step of the slowest rank per launch, then the median over rounds.
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


def _step(model: Any, optimizer: Any, backward: Any, batch: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    x, y = batch
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - t0, loss.item()


def pair(cfg: dict[str, Any]) -> dict[str, tuple[list[float], float]]:
    """accelerate's and our Accelerator in one process, same backend, steps alternated (the
    order swapped each step), so both see the same machine load."""
    from accelerate import Accelerator as HfAccelerator
    from accelerate.utils import TorchDynamoPlugin as HfPlugin

    from notebook_accel import Accelerator, TorchDynamoPlugin

    options = {"backend": cfg["backend"], "use_regional_compilation": cfg["regional"]}
    hf = HfAccelerator(cpu=True, dynamo_plugin=HfPlugin(**options))  # cpu=True: a group
    ours = Accelerator(dynamo_plugin=TorchDynamoPlugin(**options))
    runs = {}
    for name, acc in (("HF accelerate", hf), ("notebook_accel", ours)):
        model, optimizer, loader = acc.prepare(*_setup(cfg))
        runs[name] = (model, optimizer, acc.backward, iter(loader))
    times: dict[str, list[float]] = {name: [] for name in runs}
    last: dict[str, float] = {}
    for i in range(cfg["steps"]):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]
        for name in order:
            model, optimizer, backward, batches = runs[name]
            seconds, last[name] = _step(model, optimizer, backward, next(batches))
            times[name].append(seconds)
    ours.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {name: (times[name], last[name]) for name in runs}


WHO = ("HF accelerate", "notebook_accel")
MODES = ("eager", "compiled")


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
    step_ms: dict[tuple[str, str], list[float]] = {(w, m): [] for w in WHO for m in MODES}
    final_loss: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            cfg = dict(base, backend="no" if mode == "eager" else args.backend)
            cfg["regional"] = args.regional and mode == "compiled"
            ranks = debug_launcher(pair, args=(cfg,), num_processes=args.processes, output="none")
            for who in WHO:
                ms = max(statistics.median(r[who][0][args.warmup :]) for r in ranks) * 1e3
                step_ms[(who, mode)].append(ms)
                final_loss[(who, mode)] = ranks[0][who][1]
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
    for who in WHO:
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
