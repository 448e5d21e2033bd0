"""Peak memory per rank and step time of each strategy on one model, beside its peers.

The MLP of benchmarks/fsdp_memory.py (``--layers`` x Linear(``--width``), fp32: 268 MB by
default), AdamW, random batches, 2 CPU processes (gloo), each variant in its own launch,
variants interleaved over ``--rounds`` rounds, medians reported (see fsdp_memory.py for how
peak RSS and step time are measured).

- DDP, FSDP (ours), ZeRO-2 / ZeRO-3 (ours: ``Accelerator(deepspeed_plugin=...)``), TP=2 (ours:
  ``ParallelismConfig(tp_size=2)``, Linear layers alternately colwise/rowwise);
- peers: accelerate's DeepSpeed plugin at the same ZeRO stages, and raw torch's
  ``parallelize_module`` with the same TP plan.
- ZeRO-3 rows build the model partitioned, each the way its library's users get it: ours in
  ``accelerator.state.deepspeed_plugin.zero3_init_context_manager(enable=True)``, accelerate's
  in ``deepspeed.zero.Init(config_dict_or_path=plugin.deepspeed_config)`` (its flag reaches only
  transformers' ``from_pretrained``); the optimizer is made after, outside. "ZeRO-3 whole" rows
  build the whole model first on every rank (as before), for both libraries.

Targets (issue 11): ZeRO-3 and TP=2 <= 0.6x DDP's peak per rank; each ZeRO stage's step time
<= 1.1x accelerate's at that stage; TP=2 <= 1.1x raw torch's.

Quiet 2-core machine, 2026-11-30, 2 interleaved rounds of 4 timed steps (``--rounds 2``, the
seven rows below):

    variant               peak MiB   vs DDP   ms/step   vs peer
    DDP (ours)                1496    1.00x       816
    ZeRO-2 (ours)             1257    0.84x      1431     1.00x
    ZeRO-2 (accelerate)       1440    0.96x      1436
    ZeRO-3 (ours)              857    0.57x      1324     0.76x
    ZeRO-3 (accelerate)       2374    1.59x      1733
    TP=2 (ours)                687    0.46x       306     0.86x
    TP=2 (raw torch)           952    0.64x       355

On the shared 2-core dev machine (load average ~4 from other jobs: memory figures hold,
step times are noisy by +-30% between runs), 1 round of 4 timed steps unless said:

    variant               peak MiB   vs DDP   ms/step   vs peer
    DDP (ours)                1528    1.00x      1242
    FSDP (ours)                618    0.40x      3574
    ZeRO-2 (ours)             1259    0.82x      2066     0.79x   (2 rounds, interleaved)
    ZeRO-2 (accelerate)       1344    0.88x      2613
    ZeRO-3 (ours)              856    0.56x      2588     1.02x   (3 rounds, interleaved;
    ZeRO-3 (accelerate)       2354    1.54x      2543              others: 1.20x, 0.67x)
    ZeRO-3 whole (ours)        860    0.56x      2665     0.91x
    ZeRO-3 whole (acc.)       2239    1.47x      2929
    TP=2 (ours)                738    0.48x       447     0.92x   (2 rounds, interleaved;
    TP=2 (raw torch)          1007    0.66x       488              1 round: 598 vs 409)

Before (same machine, 1 round): DDP 1496 MiB / 801 ms; ZeRO-2 ours 1365 MiB / 2349 ms vs
accelerate 1343 / 2497; ZeRO-3 ours 2403 MiB / 2631 ms vs accelerate 2337 / 2428 (both built
whole); TP=2 ours 675 MiB / 445 ms vs raw torch 936 / 613. Where ZeRO-3's peak was, measured
by sampling VmRSS with the Python stack: at build the whole model (and, on glibc's heap, the
freed full layers stayed resident); then every step grew the heap (glibc's adaptive mmap
threshold kept freed gathered layers resident: 1995 MiB after 4 steps and rising); the last
~400 MiB came from DeepSpeed's defaults: Adam over the whole 128 MiB partition at once
(``sub_group_size`` 1e9: temporaries twice its size) and every gathered layer kept from forward
to backward (``stage3_max_reuse_distance``/``max_live_parameters`` 1e9). Ours now serves
blocks >= 1 MiB with mmap on CPU and sizes those from the largest layer (README); the rest of
the 860 MiB is the partitions themselves: parameters, fp32 master copy, two Adam moments and
gradients (128 MiB each). With those sizes, DeepSpeed's defaults for them were not faster here
(interleaved, 2 rounds: ours 860 MiB / 1809 ms; reuse 1e9: 1042 / 1975; sub_group 1e9: 1147 /
2653; default buckets: 1535 / 1978).

Run: ``python benchmarks/strategies_memory.py [--only "ZeRO-3 (ours)" ...]`` (needs deepspeed
and accelerate).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _measure import Result, peak_since, reset_peak
from fsdp_memory import _build, _model, _train, ddp, ours_fsdp, run_mlp_variants


def _plan(cfg: dict[str, Any]) -> dict[str, str]:
    # Linear layers sit at even indices (ReLU between): colwise then rowwise, pair by pair.
    return {str(2 * i): ("colwise" if i % 2 == 0 else "rowwise") for i in range(cfg["layers"])}


def _built(cfg: dict[str, Any], init: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    # The model inside the ZeRO-3 init context (partitioned layer by layer), its optimizer
    # after, over the partitioned parameters; ``init=None``: built whole.
    with init if init is not None else contextlib.nullcontext():
        model = _model(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _ours_zero(cfg: dict[str, Any], stage: int, zero_init: bool = False) -> Result:
    from notebook_accel.options.deepspeed import DeepSpeedPlugin
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    base = reset_peak()
    plugin = acc.state.deepspeed_plugin
    init = plugin.zero3_init_context_manager(enable=True) if zero_init else None
    model, opt = acc.prepare(*_built(cfg, init))
    times = _train(model, opt, acc.backward, cfg)
    return times, peak_since(base)


def _accelerate_zero(cfg: dict[str, Any], stage: int, zero_init: bool = False) -> Result:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_accumulation_steps=1)
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg["batch"]
    plugin.deepspeed_config["train_batch_size"] = cfg["batch"] * 2
    plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
    plugin.deepspeed_config["gradient_clipping"] = 0.0
    acc = Accelerator(deepspeed_plugin=plugin)
    base = reset_peak()
    init = None
    if zero_init:
        # accelerate's zero3_init_flag reaches transformers' from_pretrained only: for a
        # plain module its users open deepspeed.zero.Init with the plugin's config.
        import deepspeed
        import torch._dynamo  # noqa: F401  (see notebook_accel's zero3_init)

        init = deepspeed.zero.Init(config_dict_or_path=plugin.deepspeed_config)
    model, opt = acc.prepare(*_built(cfg, init))
    times = _train(model, opt, acc.backward, cfg)
    return times, peak_since(base)


def ours_tp(cfg: dict[str, Any]) -> Result:
    from notebook_accel.options.parallelism import ParallelismConfig
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2, tp_plan=_plan(cfg)))
    base = reset_peak()
    model, opt = acc.prepare(*_build(cfg))
    times = _train(model, opt, acc.backward, cfg)
    return times, peak_since(base)


def torch_tp(cfg: dict[str, Any]) -> Result:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.distributed.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    base = reset_peak()
    model, _ = _build(cfg)
    styles = {
        k: ColwiseParallel() if v == "colwise" else RowwiseParallel() for k, v in _plan(cfg).items()
    }
    parallelize_module(model, mesh, styles)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = _train(model, opt, lambda loss: loss.backward(), cfg)
    return times, peak_since(base)


VARIANTS: dict[str, Callable[[dict[str, Any]], Result]] = {
    "DDP (ours)": ddp,
    "FSDP (ours)": ours_fsdp,
    "ZeRO-2 (ours)": lambda cfg: _ours_zero(cfg, 2),
    "ZeRO-2 (accelerate)": lambda cfg: _accelerate_zero(cfg, 2),
    "ZeRO-3 (ours)": lambda cfg: _ours_zero(cfg, 3, zero_init=True),
    "ZeRO-3 (accelerate)": lambda cfg: _accelerate_zero(cfg, 3, zero_init=True),
    "ZeRO-3 whole (ours)": lambda cfg: _ours_zero(cfg, 3),
    "ZeRO-3 whole (acc.)": lambda cfg: _accelerate_zero(cfg, 3),
    "TP=2 (ours)": ours_tp,
    "TP=2 (raw torch)": torch_tp,
}
PEER = {
    "ZeRO-2 (ours)": "ZeRO-2 (accelerate)",
    "ZeRO-3 (ours)": "ZeRO-3 (accelerate)",
    "ZeRO-3 whole (ours)": "ZeRO-3 whole (acc.)",
    "TP=2 (ours)": "TP=2 (raw torch)",
}


def main() -> None:
    names, step_ms, peak_mib = run_mlp_variants(VARIANTS, __doc__.splitlines()[0], steps=6)
    nan = [float("nan")]
    ddp_mem = statistics.median(peak_mib.get("DDP (ours)") or nan)
    print(f"{'variant':<22}{'peak RSS/rank MiB':>19}{'vs DDP':>8}{'ms/step':>10}{'vs peer':>9}")
    for name in names:
        ms, mem = statistics.median(step_ms[name]), statistics.median(peak_mib[name])
        peer = statistics.median(step_ms.get(PEER.get(name, ""), nan))
        versus = "" if name not in PEER else f"{ms / peer:>8.2f}x"  # peers have no peer
        print(f"{name:<22}{mem:>19.0f}{mem / ddp_mem:>7.2f}x{ms:>10.0f}{versus}")


if __name__ == "__main__":
    main()
