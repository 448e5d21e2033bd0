"""Ways of spreading a model over the job's processes, behind one interface.

    base.py   Strategy: prepare model/optimizer, backward, no_sync, clipping, state dict,
              checkpoint parts, the data-parallel rank and size
    ddp.py    DdpStrategy: DistributedDataParallel (a single process: no wrapper)
    fsdp.py   FsdpStrategy: FSDP2 over ``sharder.Sharder``, DCP checkpoints
    deepspeed.py  DeepSpeedStrategy: ZeRO 0-3 through a DeepSpeed engine (optional extra)
    tensor_parallel.py  TensorParallelStrategy: parallelize_module on a "tp" mesh

The Accelerator builds one with :func:`select` and delegates to it; which options may be
combined was settled before (options/rules.py).
"""

from __future__ import annotations

from typing import Any

from ...options.deepspeed import DeepSpeedPlugin
from ...options.fsdp import FsdpConfig
from ...options.parallelism import ParallelismConfig
from ..handlers import DistributedDataParallelKwargs
from ..process import GradientState, ProcessState
from .base import CheckpointPart, Strategy

__all__ = ["CheckpointPart", "Strategy", "select"]


def select(
    state: ProcessState,
    *,
    fsdp: FsdpConfig | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
    ddp_handler: DistributedDataParallelKwargs | None = None,
    deepspeed: DeepSpeedPlugin | None = None,
    gradient_state: GradientState | None = None,
    mixed_precision: str = "no",
    split_batches: bool = False,
    parallelism: ParallelismConfig | None = None,
) -> Strategy:
    """The strategy for an Accelerator's options, settled already (training/choices.py, the
    rules of options/rules.py): with a mesh, tensor parallelism when ``tp_size > 1``, else
    FSDP/HSDP when ``dp_shard_size > 1``; DeepSpeed when a plugin is given; FSDP when
    ``fsdp`` is set; else DDP (which leaves a single process's models unwrapped).

    Raises:
        ConfigError: the strategy refuses this job (a hybrid mesh the job's size does not
            allow, a precision DeepSpeed does not train with here).
    """
    if parallelism is not None:
        if parallelism.tp_size > 1:
            from .tensor_parallel import TensorParallelStrategy

            return TensorParallelStrategy(state, parallelism)
        if parallelism.dp_shard_size > 1:
            # The same FsdpConfig fsdp="hybrid" (or "full") builds: one mechanism for both.
            hybrid = parallelism.dp_replicate_size > 1
            fsdp = FsdpConfig(
                sharding_strategy="hybrid" if hybrid else "full",
                hybrid_shard_size=parallelism.dp_shard_size if hybrid else None,
            )
    if deepspeed is not None:
        from .deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(
            state,
            deepspeed,
            gradient_state or GradientState(accumulation_steps=1),
            mixed_precision,
            split_batches,
        )
    if fsdp:
        from .fsdp import FsdpStrategy

        return FsdpStrategy(state, fsdp)
    from .ddp import DdpStrategy

    return DdpStrategy(state, dict(ddp_kwargs or {}), ddp_handler)
