"""Fully sharded data parallelism (torch's FSDP2, ``fully_shard``) behind one small config.

    Accelerator(fsdp=FsdpConfig(...) | dict | "full" | None)
        -> FsdpConfig.coerce(...)         validated once, before any process group work
        -> Sharder(config, state)         refuses a single process, checks the hybrid mesh
    prepare(model)      -> Sharder.shard: rank 0's weights broadcast (as DDP does), then
                           fully_shard on the auto-wrap targets bottom-up, then on the root;
                           the old -> new Parameter map is kept (weakly) for the optimizers
    prepare(optimizer)  -> Sharder.repoint: param_groups (and any state) point at the shards
    accumulate (no sync)-> no_sync(model): no reduce-scatter, no reshard after backward
    clip_grad_norm_     -> the DTensor norm made global with ``full_tensor()``, then clipped

``fully_shard`` registers new DTensor parameters in place of the module's ones, so an optimizer
built from ``model.parameters()`` before ``prepare`` would keep stepping the discarded full
tensors; :meth:`Sharder.repoint` fixes that by matching parameters by their qualified name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from .errors import ConfigError
from .state import ProcessState

__all__ = [
    "FsdpConfig",
    "ShardingStrategy",
    "Sharder",
    "is_sharded",
    "no_sync",
    "total_norm",
    "clip_grad_norm_",
    "full_state_dict",
]

ShardingStrategy = Literal["full", "grad_op", "no_shard", "hybrid"]
DtypeName = Literal["fp32", "bf16", "fp16"]
_DTYPES: dict[str, torch.dtype] = {
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
            if value is not None and value not in _DTYPES:
                raise ConfigError(f"fsdp.{name}", value, _one_of([*_DTYPES, None]))
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

    def to_option(self) -> str:
        """JSON for a launch option (``NOTEBOOK_ACCEL_FSDP``); :meth:`coerce` reads it back."""
        return json.dumps(dataclasses.asdict(self))


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` went through ``fully_shard``."""
    return isinstance(model, FSDPModule)


class Sharder:
    """Shards models and re-points optimizers for one Accelerator.

    Raises:
        ConfigError: a single process, or a hybrid mesh that the job's size does not allow.

    Example:
        >>> sharder = Sharder(FsdpConfig(), accelerator.state)  # doctest: +SKIP
        >>> model = sharder.shard(model); sharder.repoint(optimizer)  # doctest: +SKIP
    """

    def __init__(self, config: FsdpConfig, state: ProcessState) -> None:
        if state.world_size < 2:
            raise ConfigError(
                "fsdp",
                config.sharding_strategy,
                "FSDP in a job of at least 2 processes (this one has 1)",
                "Launch with notebook_launcher(..., num_processes=2) or more, or drop fsdp=.",
            )
        self.config = config
        self.state = state
        self.mesh_shape = _mesh_shape(config, state)
        self._mesh: DeviceMesh | None = None
        # id(old Parameter) -> (weak ref to it, its sharded replacement); weak so that the
        # full-size originals are freed as soon as no optimizer refers to them any more.
        self._moved: dict[int, tuple[weakref.ref[torch.nn.Parameter], torch.nn.Parameter]] = {}

    @property
    def mesh(self) -> DeviceMesh:
        """The device mesh, built on first use (it creates process groups: every rank)."""
        if self._mesh is None:
            names = ("replicate", "shard") if len(self.mesh_shape) == 2 else ("shard",)
            self._mesh = init_device_mesh(
                self.state.device.type, self.mesh_shape, mesh_dim_names=names
            )
        return self._mesh

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """``fully_shard`` the auto-wrap targets bottom-up, then the root; return the root."""
        if is_sharded(model):
            return model
        targets = wrap_targets(model, self.config)
        old = {name: weakref.ref(p) for name, p in model.named_parameters()}
        if self.config.sync_module_states:
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        kwargs = self._shard_kwargs()
        for module in targets:
            fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        new = dict(model.named_parameters())
        for name, ref in old.items():
            param = ref()
            if param is not None and name in new:
                self._moved[id(param)] = (ref, new[name])
        return model

    def _shard_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        offload = CPUOffloadPolicy(pin_memory=self.state.device.type == "cuda")
        return {
            "mesh": self.mesh,
            # Only "full" (and hybrid's shards) free gathered weights between forward and
            # backward; no_shard has nothing to free.
            "reshard_after_forward": cfg.sharding_strategy in ("full", "hybrid"),
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=_DTYPES.get(cfg.param_dtype or ""),
                reduce_dtype=_DTYPES.get(cfg.reduce_dtype or ""),
            ),
            "offload_policy": offload if cfg.cpu_offload else OffloadPolicy(),
        }

    def repoint(self, optimizer: torch.optim.Optimizer) -> int:
        """Make ``optimizer`` hold the sharded parameters; return how many were replaced.

        State the optimizer already has (loaded before prepare) is cut to each rank's shard.
        """
        count = 0
        for group in optimizer.param_groups:
            for i, param in enumerate(group["params"]):
                entry = self._moved.get(id(param))
                if entry is None or entry[0]() is not param:
                    continue
                new = entry[1]
                group["params"][i] = new
                if param in optimizer.state:
                    old_state = optimizer.state.pop(param)  # type: ignore[arg-type]
                    optimizer.state[new] = {k: _like(v, new) for k, v in old_state.items()}
                count += 1
        return count


def _mesh_shape(config: FsdpConfig, state: ProcessState) -> tuple[int, ...]:
    world = state.world_size
    if config.sharding_strategy == "no_shard":
        # FSDP2's replication: a (replicas, 1) mesh; gradients are all-reduced as in DDP.
        return (world, 1)
    if config.sharding_strategy != "hybrid":
        return (world,)
    size = config.hybrid_shard_size or state.local_world_size
    if not 1 < size < world or world % size:
        raise ConfigError(
            "fsdp.hybrid_shard_size",
            size,
            f"a divisor of the job's {world} processes strictly between 1 and {world}",
            "Hybrid sharding needs at least 2 shard groups of at least 2 processes; "
            'with one group use "full", with groups of 1 use "no_shard".',
        )
    return (world // size, size)


def wrap_targets(model: torch.nn.Module, config: FsdpConfig) -> list[torch.nn.Module]:
    """The submodules to shard as their own units, innermost first (root excluded).

    Raises:
        ConfigError: an ``auto_wrap_classes`` name that no module of ``model`` has.
    """
    wanted = set(config.auto_wrap_classes)
    present = {type(m).__name__ for m in model.modules()}
    missing = sorted(wanted - present)
    if missing:
        raise ConfigError(
            "fsdp.auto_wrap_classes",
            missing[0],
            "a module class name found in the model: " + ", ".join(sorted(present)),
        )
    chosen: list[torch.nn.Module] = []
    seen: set[int] = set()

    def visit(module: torch.nn.Module) -> int:
        # Returns the parameters under ``module`` not yet inside a chosen unit.
        if id(module) in seen:  # a shared submodule is counted once
            return 0
        seen.add(id(module))
        loose = sum(p.numel() for p in module.parameters(recurse=False))
        loose += sum(visit(child) for child in module.children())
        by_class = type(module).__name__ in wanted
        by_size = 0 < config.min_num_params <= loose
        if module is not model and loose and (by_class or by_size):
            chosen.append(module)
            return 0
        return loose

    visit(model)
    return chosen


def _like(value: Any, param: torch.nn.Parameter) -> Any:
    # Per-parameter state (Adam's moments) has the parameter's full shape: keep this rank's
    # part, cut locally (src_data_rank=None: every rank already holds the same full tensor).
    if isinstance(value, torch.Tensor) and isinstance(param, DTensor):
        if not isinstance(value, DTensor) and value.shape == param.shape and value.dim() > 0:
            return distribute_tensor(
                value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
            )
    return value


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients locally: no reduce-scatter and no re-sharding after backward.

    Example:
        >>> with no_sync(model):  # doctest: +SKIP
        ...     model(x).sum().backward()
    """
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    # Keeping the gathered weights saves the next micro-batch's all-gather (costs memory).
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def total_norm(grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of ``grads`` over every shard (a plain tensor, the same on every rank)."""
    norm = torch.nn.utils.get_total_norm(grads, norm_type)
    # Over DTensor shards the norm is a partial result: full_tensor() reduces it across ranks.
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also works on sharded (DTensor) gradients.

    Example:
        >>> clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
        tensor(0.4212)
    """
    params = list(parameters)
    norm = total_norm([p.grad for p in params if p.grad is not None], norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The unsharded state dict on the main process (``{}`` elsewhere); call on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
