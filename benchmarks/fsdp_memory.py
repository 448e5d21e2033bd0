"""Peak memory per rank and step time: DDP vs notebook_accel's FSDP vs accelerate's FSDP plugin.

The same MLP of large Linear layers (``--layers`` x ``--width``^2, fp32: 268 MB by default),
AdamW and random batches run on 2 CPU processes (gloo); each variant runs in its own launch
(fresh worker processes), variants interleaved over ``--rounds`` rounds, medians reported.

- memory: peak resident set size of each rank over the whole job (model built, prepared, then
  trained), above the RSS before the model was built. The kernel's high-water mark is reset
  (``echo 5 > /proc/self/clear_refs``) before the model is built and ``VmHWM`` is read after the
  last step, so the figure covers every tensor torch allocated, transient ones included. The
  larger of the two ranks is shown. Linux only.
- time: each step (forward, backward, clipping-free optimizer step, zero_grad) with
  ``time.perf_counter``; the first ``--warmup`` steps are dropped; the slower rank's median.

accelerate (1.15 and 1.16) only enables its FSDP plugin for GPU-like devices (on CPU it
silently keeps DDP), so for its column the benchmark sets ``distributed_type = FSDP`` on
accelerate's state after construction; accelerate's own FSDP2 code then shards the model
(``fully_shard`` per Linear, like ours with ``auto_wrap_classes=("Linear",)``) and switches
the optimizer.

Our default FSDP (``return_freed_memory=True``) serves blocks of 1 MiB and more with mmap and
turns on torch's transparent huge pages (``THP_MEM_ALLOC_ENABLE``); "heap" leaves glibc as it is.
On the 2-core dev machine (THP ``madvise``, 3 rounds): DDP 1483 MiB / 527 ms, ours 621 MiB
(0.42x) / 1249 ms (1.03x accelerate's), heap 1944 MiB / 1191 ms, accelerate 1897 MiB / 1210 ms;
without huge pages ours took ~2.1 s/step (~700k page faults per step instead of ~107k).

Run: ``python benchmarks/fsdp_memory.py [--only "FSDP (ours)" ...]`` (needs accelerate).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from _measure import Result, peak_since, reset_peak, run_rounds


def _model(cfg: dict[str, Any]) -> torch.nn.Module:
    torch.set_num_threads(1)  # 2 processes on a 2-core machine
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(cfg["layers"]):
        layers += [torch.nn.Linear(cfg["width"], cfg["width"]), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _build(cfg: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model(cfg)
    # Created before prepare, as accelerate's users do.
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _train(
    model: Any, opt: Any, backward: Callable[[torch.Tensor], None], cfg: dict[str, Any]
) -> list[float]:
    g = torch.Generator().manual_seed(torch.distributed.get_rank())
    x = torch.randn(cfg["batch"], cfg["width"], generator=g)
    y = torch.randn(cfg["batch"], cfg["width"], generator=g)
    times = []
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return times


def ddp(cfg: dict[str, Any]) -> Result:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    base = reset_peak()
    model, opt = acc.prepare(*_build(cfg))
    times = _train(model, opt, acc.backward, cfg)
    return times, peak_since(base)


def ours_fsdp(cfg: dict[str, Any], return_freed_memory: bool = True) -> Result:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(
        fsdp={
            "sharding_strategy": "full",
            "auto_wrap_classes": ["Linear"],
            "return_freed_memory": return_freed_memory,
        }
    )
    base = reset_peak()
    model, opt = acc.prepare(*_build(cfg))
    times = _train(model, opt, acc.backward, cfg)
    return times, peak_since(base)


def ours_fsdp_heap(cfg: dict[str, Any]) -> Result:
    return ours_fsdp(cfg, return_freed_memory=False)


def accelerate_fsdp(cfg: dict[str, Any]) -> Result:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Linear"],
        reshard_after_forward=True,
    )
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    # See the module docstring: on CPU accelerate would otherwise quietly use DDP.
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    assert acc.num_processes == 2 and acc.is_fsdp2
    base = reset_peak()
    model, opt = acc.prepare(*_build(cfg))
    times = _train(model, opt, acc.backward, cfg)
    sharded = type(next(model.parameters())).__name__ == "DTensor"
    assert sharded, "accelerate did not shard the model"
    return times, peak_since(base)


VARIANTS: dict[str, Callable[[dict[str, Any]], Result]] = {
    "DDP (ours)": ddp,
    "FSDP (ours)": ours_fsdp,
    "FSDP (ours, heap)": ours_fsdp_heap,
    "FSDP (accelerate)": accelerate_fsdp,
}


def run_mlp_variants(
    variants: Mapping[str, Callable[[dict[str, Any]], Result]], description: str, steps: int
) -> tuple[list[str], dict[str, list[float]], dict[str, list[float]]]:
    """The command line shared with strategies_memory.py: parse it, run the chosen variants
    over interleaved rounds, print the model line; returns (names, step ms, peak MiB)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16, help="per process")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--only", action="append", choices=list(variants), help="run this variant (repeatable)"
    )
    args = parser.parse_args()
    cfg = {"layers": args.layers, "width": args.width, "batch": args.batch, "steps": args.steps}
    names = args.only or list(variants)
    step_ms, peak_mib = run_rounds(variants, names, cfg, args.rounds, args.warmup)
    params = args.layers * (args.width**2 + args.width)
    print(
        f"\nMLP {args.layers} x Linear({args.width}, {args.width}): {params / 1e6:.1f} M params "
        f"({params * 4 / 2**20:.0f} MiB fp32), AdamW, batch {args.batch}/process, 2 CPU "
        f"processes (gloo), {args.steps - args.warmup} timed steps x {args.rounds} rounds; "
        f"torch {torch.__version__}"
    )
    return names, step_ms, peak_mib


def main() -> None:
    names, step_ms, peak_mib = run_mlp_variants(VARIANTS, __doc__.splitlines()[0], steps=8)
    # Ratios need their reference variant; with --only they may be missing (nan).
    ddp_mem = statistics.median(peak_mib.get("DDP (ours)") or [float("nan")])
    acc_ms = statistics.median(step_ms.get("FSDP (accelerate)") or [float("nan")])
    header = f"{'variant':<20}{'peak RSS/rank MiB':>19}{'vs DDP':>8}{'ms/step':>10}"
    print(header + f"{'vs acc FSDP':>13}")
    for name in names:
        ms, mem = statistics.median(step_ms[name]), statistics.median(peak_mib[name])
        print(f"{name:<20}{mem:>19.0f}{mem / ddp_mem:>7.2f}x{ms:>10.0f}{ms / acc_ms:>12.2f}x")
    print(
        "per-round (MiB, ms):",
        {
            k: [(round(m), round(t)) for m, t in zip(peak_mib[k], step_ms[k], strict=True)]
            for k in names
        },
    )


if __name__ == "__main__":
    main()
