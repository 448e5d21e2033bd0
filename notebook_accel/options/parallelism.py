"""ParallelismConfig: accelerate's description of an N-D device mesh, validated, torch-free.

    ParallelismConfig(dp_replicate_size=, dp_shard_size=, tp_size=, cp_size=)
        -> check(world_size): the sizes multiply to the job's processes
        -> strategies.select: tp_size > 1 -> TensorParallelStrategy (TP alone, or
           dp_shard_size x tp_size: TP then FSDP2 on a 2-D mesh; with
           dp_replicate_size > 1: TP then HSDP on a 3-D mesh);
           dp_shard_size > 1 -> FSDP ("hybrid" with dp_replicate_size > 1: the same
           FsdpConfig as fsdp="hybrid" builds); dp_replicate_size alone -> DDP

What is not built yet is refused by name: context parallelism (``cp_size``) and sequence
parallelism (``sp_size``, DeepSpeed's Ulysses). Their backends and handlers are accepted as
accelerate's (``cp_backend="torch"``, ``sp_backend="deepspeed"``; ``tp_handler`` a
``TorchTensorParallelConfig``, whose ``enable_async_tp`` accelerate ignores too).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = [
    "MESH_ORDER",
    "ParallelismConfig",
    "TP_STYLES",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "coerce_option",
]

# The mesh's dimensions, outermost first (accelerate's canonical order, torch's layout: a
# rank's coordinate along each is read off the rank, row-major).
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")

# transformers' names: "colwise_gather_output"/"colwise_rep" is colwise with the output
# gathered whole (e.g. lm_head before the loss).
TP_STYLES = ("colwise", "rowwise", "colwise_gather_output", "colwise_rep")


def _size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an int >= 1")
    return value


@dataclass
class TorchTensorParallelConfig:
    """accelerate's options of tensor parallelism (``ParallelismConfig(tp_handler=...)``).

    Args:
        enable_async_tp: asynchronous tensor parallelism; not supported, as in accelerate 1.16,
            which warns and ignores it: so does this.

    Example:
        >>> TorchTensorParallelConfig().enable_async_tp
        False
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn(
                "Async tensor parallelism is not supported (nor in accelerate 1.16): ignored.",
                stacklevel=3,
            )


@dataclass
class TorchTensorParallelPlugin:
    """accelerate's deprecated carrier of the tensor-parallel size:
    ``Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=N))`` is
    ``parallelism_config=ParallelismConfig(tp_size=N)``.

    Example:
        >>> TorchTensorParallelPlugin(tp_size=2).tp_size
        2
    """

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        _size("tp_size", self.tp_size)


def _choice(name: str, value: object, accepted: str) -> str:
    if value is None:
        return accepted
    if value != accepted:
        raise ConfigError(name, value, f"{accepted!r} (accelerate's only one)")
    return accepted


@dataclass(frozen=True)
class ParallelismConfig:
    """How the job's processes form a mesh (accelerate's names).

    Args:
        dp_replicate_size: replicas (DDP-like) along the data-parallel dimension.
        dp_shard_size: FSDP shards along the data-parallel dimension.
        tp_size: tensor-parallel ranks (each holds a slice of every planned layer).
        cp_size: context parallelism: must be 1 (not built yet).
        cp_backend: ``"torch"`` (accelerate's only one; ``None``: it).
        sp_size: sequence parallelism (DeepSpeed's Ulysses): must be 1 (not built yet).
        sp_backend: ``"deepspeed"`` (accelerate's only one; ``None``: it).
        tp_handler: a :class:`TorchTensorParallelConfig`; ``None``: its defaults.
        cp_handler: accelerate's ``TorchContextParallelConfig``: unused (no context
            parallelism).
        sp_handler: accelerate's ``DeepSpeedSequenceParallelConfig``: unused (no sequence
            parallelism).
        tp_plan: (ours, keyword-only) module name (``fnmatch`` patterns allowed, e.g.
            ``"layers.*.fc1"``) -> ``"colwise"``, ``"rowwise"`` or ``"colwise_gather_output"``
            (output gathered whole); ``None``: a transformers model's
            ``config.base_model_tp_plan``, else the model's own ``tp_plan``.

    Raises:
        ConfigError: a size below 1, context or sequence parallelism, another backend, or a
            plan style other than colwise/rowwise.

    Example:
        >>> ParallelismConfig(tp_size=2).tp_size
        2
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    cp_backend: str | None = None
    sp_size: int = 1
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = field(default=None, hash=False)
    cp_handler: Any = field(default=None, hash=False)
    sp_handler: Any = field(default=None, hash=False)
    tp_plan: dict[str, str] | None = field(default=None, hash=False, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
            _size(name, getattr(self, name))
        object.__setattr__(self, "cp_backend", _choice("cp_backend", self.cp_backend, "torch"))
        object.__setattr__(self, "sp_backend", _choice("sp_backend", self.sp_backend, "deepspeed"))
        if self.tp_handler is not None and not isinstance(
            self.tp_handler, TorchTensorParallelConfig
        ):
            raise ConfigError("tp_handler", self.tp_handler, "a TorchTensorParallelConfig or None")
        if self.tp_size > 1 and self.tp_handler is None:
            object.__setattr__(self, "tp_handler", TorchTensorParallelConfig())
        if self.sp_size != 1:
            raise ConfigError(
                "sp_size",
                self.sp_size,
                "1: sequence parallelism (DeepSpeed's Ulysses) is not built yet",
                "Use tensor or data parallelism.",
            )
        if self.cp_size != 1:
            raise ConfigError(
                "cp_size",
                self.cp_size,
                "1: context parallelism is not built yet",
                "Split long sequences yourself, or use tensor/data parallelism.",
            )
        if self.tp_plan is not None:
            if not isinstance(self.tp_plan, dict):
                raise ConfigError("tp_plan", self.tp_plan, "a dict of module name -> style")
            for key, style in self.tp_plan.items():
                if style not in TP_STYLES:
                    raise ConfigError(
                        f"tp_plan[{key!r}]", style, "one of " + ", ".join(map(repr, TP_STYLES))
                    )

    @property
    def total_size(self) -> int:
        """The processes the mesh needs."""
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size

    def coordinate(self, dim: str, rank: int) -> int:
        """Rank ``rank``'s index along ``dim`` (one of :data:`MESH_ORDER`), as the mesh
        lays the job's ranks out (row-major over the dimensions in that order).

        Example:
            >>> ParallelismConfig(dp_shard_size=2, tp_size=2).coordinate("tp", 3)
            1
        """
        sizes = {
            "dp_replicate": self.dp_replicate_size,
            "dp_shard": self.dp_shard_size,
            "cp": self.cp_size,
            "sp": self.sp_size,
            "tp": self.tp_size,
        }
        inner = 1
        for name in MESH_ORDER[MESH_ORDER.index(dim) + 1 :]:
            inner *= sizes[name]
        return (rank // inner) % sizes[dim]

    def check(self, world_size: int) -> None:
        """Refuse a mesh the job's size does not fill.

        Raises:
            ConfigError: naming the field and what is accepted.
        """
        if self.total_size != world_size:
            raise ConfigError(
                "parallelism_config",
                self.sizes(),
                f"sizes whose product is the job's {world_size} processes "
                f"(these multiply to {self.total_size})",
            )

    def sizes(self) -> dict[str, Any]:
        """The sizes as a dict (for messages)."""
        return {
            "dp_replicate_size": self.dp_replicate_size,
            "dp_shard_size": self.dp_shard_size,
            "tp_size": self.tp_size,
            "cp_size": self.cp_size,
        }


def coerce_option(value: object) -> dict[str, Any] | None:
    """A launch's ``parallelism_config=`` as JSON fields, validated by building the config:
    ``None``, a :class:`ParallelismConfig` or a dict of its fields.

    Raises:
        ConfigError: anything else, or a field outside its accepted values.

    Example:
        >>> coerce_option({"tp_size": 2})
        {'tp_size': 2}
    """
    if value is None or value is False:
        return None
    names = (
        "dp_replicate_size",
        "dp_shard_size",
        "tp_size",
        "cp_size",
        "cp_backend",
        "sp_size",
        "sp_backend",
        "tp_plan",
    )
    if isinstance(value, ParallelismConfig):
        fields = {n: getattr(value, n) for n in names if getattr(value, n) is not None}
    elif isinstance(value, dict) and all(k in names for k in value):
        fields = dict(value)
    else:
        raise ConfigError(
            "parallelism_config",
            value,
            "None, a ParallelismConfig or a dict of its fields (" + ", ".join(names) + ")",
        )
    ParallelismConfig(**fields)
    return fields
