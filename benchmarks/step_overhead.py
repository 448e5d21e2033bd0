"""Per-step overhead of the training loop: raw torch DDP vs HF accelerate vs notebook_accel.

The same MLP, data, optimizer and loop run on 2 CPU processes (gloo), each variant in its own
launch through ``debug_launcher`` so every variant starts from the same conditions. Only the
training loop is measured:

- time: every step (fetching the batch, forward, backward, optimizer step) with
  ``time.perf_counter``; the first ``--warmup`` steps are dropped; we report the median step of
  each rank, and keep the slower rank. Variants are interleaved (order rotated each round) over
  ``--rounds`` launches and the median over rounds is shown, so drifting machine load hits all
  of them alike.
- memory: peak resident set size (RSS) of the loop, above the RSS at its start. The kernel's
  high-water mark is reset before the loop (``echo 5 > /proc/self/clear_refs``) and ``VmHWM``
  read after it, so the figure is the true peak of the loop, tensors included (tracemalloc
  would miss torch's allocations). Linux only.

Run: ``python benchmarks/step_overhead.py`` (needs ``pip install accelerate``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _measure import peak_since, reset_peak, run_rounds
from torch.utils.data import DataLoader, TensorDataset


def _setup(hidden: int, per_rank_batch: int, steps_per_epoch: int) -> tuple[Any, ...]:
    torch.set_num_threads(1)  # 2 processes on a 2-core machine
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    n = per_rank_batch * 2 * steps_per_epoch
    data = TensorDataset(torch.randn(n, 256), torch.randn(n, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, optimizer, data


def _loop(
    model: Any, optimizer: Any, loader: Any, backward: Callable[[Any], None], epochs: int, hook: Any
) -> tuple[list[float], int]:
    start_rss = reset_peak()
    times = []
    for epoch in range(epochs):
        hook(epoch)
        batches = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            x, y = batch
            loss = F.mse_loss(model(x), y)
            backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - t0)
    return times, peak_since(start_rss)


def raw_ddp(cfg: dict) -> tuple[list[float], int]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    model, optimizer, data = _setup(cfg["hidden"], cfg["batch"], cfg["steps_per_epoch"])
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=cfg["batch"], sampler=sampler)
    try:
        return _loop(
            model, optimizer, loader, lambda loss: loss.backward(), cfg["epochs"], sampler.set_epoch
        )
    finally:
        dist.destroy_process_group()


def _prepared_loop(acc: Any, cfg: dict) -> tuple[list[float], int]:
    """The same loop for both Accelerator classes: prepare, train, end."""
    model, optimizer, data = _setup(cfg["hidden"], cfg["batch"], cfg["steps_per_epoch"])
    loader = DataLoader(data, batch_size=cfg["batch"], shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    try:
        return _loop(model, optimizer, loader, acc.backward, cfg["epochs"], lambda e: None)
    finally:
        acc.end_training()


def hf_accelerate(cfg: dict) -> tuple[list[float], int]:
    from accelerate import Accelerator

    # cpu=True: without it accelerate 1.x forms no process group on CPU (each rank alone).
    acc = Accelerator(cpu=True)
    assert acc.num_processes == 2, acc.state
    try:
        return _prepared_loop(acc, cfg)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def notebook_accel(cfg: dict) -> tuple[list[float], int]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    assert acc.num_processes == 2
    return _prepared_loop(acc, cfg)


VARIANTS: dict[str, Callable[[dict], tuple[list[float], int]]] = {
    "raw torch DDP": raw_ddp,
    "HF accelerate": hf_accelerate,
    "notebook_accel": notebook_accel,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    cfg = {
        "hidden": args.hidden,
        "batch": args.batch,
        "steps_per_epoch": args.steps_per_epoch,
        "epochs": args.epochs,
    }
    step_ms, peak_mib = run_rounds(VARIANTS, list(VARIANTS), cfg, args.rounds, args.warmup)
    base_ms = statistics.median(step_ms["raw torch DDP"])
    base_mem = statistics.median(peak_mib["raw torch DDP"])
    steps = args.epochs * args.steps_per_epoch - args.warmup
    print(
        f"\nMLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch}/process, 2 CPU processes "
        f"(gloo), {steps} timed steps x {args.rounds} rounds; torch {torch.__version__}"
    )
    print(
        f"{'variant':<16}{'median ms/step':>16}{'vs raw':>9}{'loop peak RSS MiB':>20}{'vs raw':>9}"
    )
    for name in VARIANTS:
        ms, mem = statistics.median(step_ms[name]), statistics.median(peak_mib[name])
        mem_ratio = f"{mem / base_mem:.2f}x" if base_mem > 0 else "n/a"
        print(f"{name:<16}{ms:>16.3f}{ms / base_ms:>8.3f}x{mem:>20.1f}{mem_ratio:>9}")
    print("per-round medians (ms):", {k: [round(v, 3) for v in vs] for k, vs in step_ms.items()})


if __name__ == "__main__":
    main()
