"""FsdpConfig: the frozen, validated description of how models are sharded (see ``fsdp``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from ..env import HUGE_PAGES_VARIABLE
from ..errors import ConfigError

__all__ = ["FsdpConfig", "ShardingStrategy", "DtypeName", "DTYPES", "HUGE_PAGES_VARIABLE"]

# torch's CPU allocator advises transparent huge pages for large blocks when this is "1"; it
# reads the variable at a process's first tensor allocation (see training/strategies/sharder.py).

ShardingStrategy = Literal["full", "grad_op", "no_shard", "hybrid"]
DtypeName = Literal["fp32", "bf16", "fp16"]
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def _one_of(values: Iterable[object]) -> str:
    return "one of " + ", ".join(repr(v) for v in values)


@dataclass(frozen=True)
class FsdpConfig:
    """How ``Accelerator.prepare`` shards models (a dict with these keys is accepted too).

    Attributes:
        sharding_strategy: ``"full"`` (parameters, gradients and optimizer state sharded;
            parameters re-sharded after forward), ``"grad_op"`` (as full, but parameters stay
            gathered from forward to backward: less communication, more memory),
            ``"no_shard"`` (replicated, like DDP), ``"hybrid"`` (sharded within groups of
            ``hybrid_shard_size`` processes, replicated across groups).
        auto_wrap_classes: names of module classes sharded as their own unit (e.g.
            ``("TransformerBlock",)``); each must occur in the model.
        min_num_params: also shard as its own unit every module holding at least this many
            parameters not already in a smaller unit (0: off).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory.
        param_dtype: dtype parameters are gathered and computed in (``"bf16"``...); None: as
            stored.
        reduce_dtype: dtype gradients are reduced in; None: ``param_dtype``'s.
        hybrid_shard_size: processes per shard group for ``"hybrid"`` (default: processes per
            machine).
        sync_module_states: broadcast rank 0's weights before sharding, as DDP does.
        return_freed_memory: on CPU with glibc, serve allocations of 1 MiB and more with mmap,
            so that the weights FSDP gathers and frees for every layer go back to the system
            (without it glibc's adaptive threshold keeps them in its heap and a rank's peak RSS
            ends up above DDP's; see benchmarks/fsdp_memory.py). So that these fresh blocks
            are not faulted in 4 KiB at a time, it also sets ``THP_MEM_ALLOC_ENABLE=1`` (torch
            then asks for transparent huge pages for blocks of 2 MiB and more) unless that
            variable is already set; torch reads it at the process's first allocation, so
            create the Accelerator before any tensor. Process-wide.
        activation_checkpointing: recompute each auto-wrapped unit's activations in the
            backward pass instead of keeping them (``torch.utils.checkpoint``, non-reentrant;
            the units are ``auto_wrap_classes`` / ``min_num_params``'s, which it needs).
        activation_checkpointing_offload: also keep the input each checkpointed unit saves
            for its recompute in CPU memory (``torch.autograd.graph.save_on_cpu``) until the
            backward pass; needs ``activation_checkpointing``.

    Example:
        >>> FsdpConfig(sharding_strategy="grad_op", auto_wrap_classes=("Linear",))
        FsdpConfig(sharding_strategy='grad_op', auto_wrap_classes=('Linear',), ...)
        >>> FsdpConfig.coerce({"sharding_strategy": "full", "min_num_params": 10_000})
        FsdpConfig(sharding_strategy='full', auto_wrap_classes=(), min_num_params=10000, ...)
    """

    sharding_strategy: ShardingStrategy = "full"
    auto_wrap_classes: tuple[str, ...] = ()
    min_num_params: int = 0
    cpu_offload: bool = False
    param_dtype: DtypeName | None = None
    reduce_dtype: DtypeName | None = None
    hybrid_shard_size: int | None = None
    sync_module_states: bool = True
    return_freed_memory: bool = True
    activation_checkpointing: bool = False
    activation_checkpointing_offload: bool = False

    def __post_init__(self) -> None:
        # A list or a single name is a natural thing to type; store one canonical form.
        classes = self.auto_wrap_classes
        if isinstance(classes, str):
            classes = (classes,)
        object.__setattr__(self, "auto_wrap_classes", tuple(classes))
        if self.sharding_strategy not in get_args(ShardingStrategy):
            raise ConfigError(
                "fsdp.sharding_strategy",
                self.sharding_strategy,
                _one_of(get_args(ShardingStrategy)),
            )
        if not all(isinstance(c, str) for c in self.auto_wrap_classes):
            raise ConfigError(
                "fsdp.auto_wrap_classes", self.auto_wrap_classes, "module class names (str)"
            )
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ConfigError(f"fsdp.{name}", value, _one_of([*DTYPES, None]))
        for name in ("activation_checkpointing", "activation_checkpointing_offload"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"fsdp.{name}", getattr(self, name), "True or False")
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ConfigError(
                "fsdp.activation_checkpointing_offload",
                True,
                "False unless activation_checkpointing=True (as accelerate requires)",
            )
        if self.activation_checkpointing and not (self.auto_wrap_classes or self.min_num_params):
            raise ConfigError(
                "fsdp.activation_checkpointing",
                True,
                "False, or auto-wrapped units to checkpoint (auto_wrap_classes or min_num_params)",
            )
        for name, value in (
            ("min_num_params", self.min_num_params),
            ("hybrid_shard_size", self.hybrid_shard_size or 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"fsdp.{name}", value, "an int >= 0")

    @classmethod
    def coerce(cls, value: object) -> FsdpConfig | None:
        """Accept a config, a dict of its fields, a strategy name, JSON of either, or off.

        ``None``, ``False``, ``""`` and ``"no"`` mean no FSDP.

        Raises:
            ConfigError: an unknown key, strategy or field value.
        """
        if value is None or value is False or value in ("", "no", "false"):
            return None
        if isinstance(value, cls):
            return value
        if value is True:
            return cls()
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("{") else {"sharding_strategy": text}
        if not isinstance(value, Mapping):
            raise ConfigError("fsdp", value, "an FsdpConfig, a dict of its fields, or None")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ConfigError(f"fsdp[{unknown[0]!r}]", value[unknown[0]], _one_of(sorted(fields)))
        return cls(**dict(value))

    def returns_freed_memory(self, device_type: str) -> bool:
        """Whether ``return_freed_memory`` applies on this device (glibc tuning: CPU only)."""
        return self.return_freed_memory and device_type == "cpu"

    def worker_variables(self, device_type: str) -> dict[str, str]:
        """Environment that FSDP workers on ``device_type`` should start with.

        Set at a worker's start, huge pages cover even tensors made before ``Accelerator()``.
        """
        return {HUGE_PAGES_VARIABLE: "1"} if self.returns_freed_memory(device_type) else {}

    def to_option(self) -> str:
        """JSON for a launch option (``NOTEBOOK_ACCEL_FSDP``); :meth:`coerce` reads it back."""
        return json.dumps(dataclasses.asdict(self))
