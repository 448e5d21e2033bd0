"""A transformer block in bf16 on one GPU: raw torch (autocast) vs notebook_accel vs HF accelerate.

Each variant trains the same stack of ``nn.TransformerEncoderLayer`` blocks (pre-norm, bf16
autocast, AdamW) on one GPU, in its own launch (``notebook_launcher(num_processes=1)``), so every
variant starts in a fresh process with an empty CUDA cache. Measured:

- ms/step: ``--steps`` optimizer steps after ``--warmup`` untimed ones, timed as one block
  between two ``torch.cuda.synchronize()`` calls (per-step synchronisation would add the same
  stall to every variant and hide the launch queue); the batch stays on the GPU, so this is the
  training step's overhead, not data loading. Variants are interleaved, the order rotated each
  round, and the median over ``--rounds`` is shown.
- peak GPU memory: ``torch.cuda.max_memory_allocated()`` over the timed loop (after
  ``reset_peak_memory_stats``), in MiB.
- launch time, seen from the calling process: the first launch (the forkserver starts and
  imports torch, the worker creates its CUDA context) and a warm one (median of 3), each running
  a function that puts one tensor on the GPU and reads it back.

Target: notebook_accel within 1.02x of raw torch per step. Without a CUDA GPU the script says so
and exits (status 0). Run: ``python benchmarks/gpu_step.py`` (``pip install accelerate`` for
its column).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

Result = tuple[float, float]  # ms/step, peak MiB


def _gpus() -> int:
    """Visible GPUs, counted through NVML without initialising CUDA here."""
    import torch

    return int(torch.cuda.device_count()) if torch.version.cuda else 0


def _setup(cfg: dict[str, Any], device: Any) -> tuple[Any, Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    layers = [
        torch.nn.TransformerEncoderLayer(
            cfg["d_model"],
            cfg["heads"],
            dim_feedforward=4 * cfg["d_model"],
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        for _ in range(cfg["layers"])
    ]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shape = (cfg["batch"], cfg["seq"], cfg["d_model"])
    x = torch.randn(*shape, device=device)
    y = torch.randn(*shape, device=device)
    return model, optimizer, x, y


def _timed(step: Callable[[], None], cfg: dict[str, Any]) -> Result:
    import torch

    for _ in range(cfg["warmup"]):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return elapsed / cfg["steps"] * 1e3, torch.cuda.max_memory_allocated() / 2**20


def raw_torch(cfg: dict[str, Any]) -> Result:
    import torch
    import torch.nn.functional as F

    model, optimizer, x, y = _setup(cfg, "cuda")
    model.cuda()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed(step, cfg)


def _prepared(acc: Any, cfg: dict[str, Any]) -> Result:
    import torch.nn.functional as F

    model, optimizer, x, y = _setup(cfg, acc.device)
    model, optimizer = acc.prepare(model, optimizer)

    def step() -> None:
        out = model(x)  # the prepared model runs under bf16 autocast, outputs in float32
        loss = F.mse_loss(out, y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return _timed(step, cfg)


def ours(cfg: dict[str, Any]) -> Result:
    from notebook_accel import Accelerator

    return _prepared(Accelerator(mixed_precision="bf16"), cfg)


def hf_accelerate(cfg: dict[str, Any]) -> Result:
    from accelerate import Accelerator

    return _prepared(Accelerator(mixed_precision="bf16"), cfg)


def _cuda_hello() -> float:
    import torch

    return float(torch.ones(1, device="cuda").sum().item())


def launch_times() -> tuple[float, float]:
    """Seconds for the first launch in this process, and the median of 3 warm ones."""
    from notebook_accel import notebook_launcher

    def once() -> float:
        start = time.perf_counter()
        assert notebook_launcher(_cuda_hello, num_processes=1, output="none") == [1.0]
        return time.perf_counter() - start

    first = once()
    return first, statistics.median(once() for _ in range(3))


VARIANTS: dict[str, Callable[[dict[str, Any]], Result]] = {
    "raw torch (autocast)": raw_torch,
    "notebook_accel": ours,
    "HF accelerate": hf_accelerate,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if _gpus() == 0:
        print("gpu_step: no CUDA GPU visible; nothing to measure (run it on a GPU machine).")
        return 0
    from notebook_accel import notebook_launcher

    first, warm = launch_times()  # before any other launch: the first one is really cold
    cfg = {k: getattr(args, k) for k in ("layers", "heads", "batch", "seq", "warmup", "steps")}
    cfg["d_model"] = args.d_model
    names = [n for n in VARIANTS if n != "HF accelerate" or importlib.util.find_spec("accelerate")]
    ms: dict[str, list[float]] = {n: [] for n in names}
    mib: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            step_ms, peak = notebook_launcher(
                VARIANTS[name], args=(cfg,), num_processes=1, output="none"
            )[0]
            ms[name].append(step_ms)
            mib[name].append(peak)

    import torch

    print(
        f"\n{args.layers} x TransformerEncoderLayer(d_model={args.d_model}, heads={args.heads}, "
        f"pre-norm), batch {args.batch} x {args.seq} tokens, bf16 autocast, AdamW; 1 GPU "
        f"({_gpu_name()}); {args.steps} timed steps x {args.rounds} rounds; "
        f"torch {torch.__version__}"
    )
    print(f"{'variant':<22}{'ms/step':>10}{'vs raw':>9}{'peak GPU MiB':>15}{'vs raw':>9}")
    base_ms = statistics.median(ms["raw torch (autocast)"])
    base_mib = statistics.median(mib["raw torch (autocast)"])
    for name in names:
        m, p = statistics.median(ms[name]), statistics.median(mib[name])
        print(f"{name:<22}{m:>10.2f}{m / base_ms:>8.3f}x{p:>15.0f}{p / base_mib:>8.3f}x")
    if "HF accelerate" not in names:
        print(f"{'HF accelerate':<22}{'not installed (pip install accelerate)':>43}")
    ratio = statistics.median(ms["notebook_accel"]) / base_ms
    print(f"target notebook_accel <= 1.02x raw per step: {'met' if ratio <= 1.02 else 'NOT met'}")
    print(f"launch with a CUDA worker: first {first:.2f} s, warm {warm:.2f} s (median of 3)")
    print("per-round ms/step:", {k: [round(v, 2) for v in vs] for k, vs in ms.items()})
    return 0


def _gpu_name() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001  (only a label)
        return "name unknown"


if __name__ == "__main__":
    sys.exit(main())
