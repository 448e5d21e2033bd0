"""ParallelismConfig: accelerate's description of an N-D device mesh, validated, torch-free.

    ParallelismConfig(dp_replicate_size=, dp_shard_size=, tp_size=, cp_size=)
        -> check(world_size): the sizes multiply to the job's processes
        -> strategies.select: tp_size > 1 -> TensorParallelStrategy (TP alone, or
           dp_shard_size x tp_size: TP then FSDP2 on a 2-D mesh; with
           dp_replicate_size > 1: TP then HSDP on a 3-D mesh);
           dp_shard_size > 1 -> FSDP ("hybrid" with dp_replicate_size > 1: the same
           FsdpConfig as fsdp="hybrid" builds); dp_replicate_size alone -> DDP

What is not built yet is refused by name: context parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["ParallelismConfig", "TP_STYLES", "coerce_option"]

# transformers' names: "colwise_gather_output"/"colwise_rep" is colwise with the output
# gathered whole (e.g. lm_head before the loss).
TP_STYLES = ("colwise", "rowwise", "colwise_gather_output", "colwise_rep")


def _size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an int >= 1")
    return value


@dataclass(frozen=True)
class ParallelismConfig:
    """How the job's processes form a mesh (accelerate's names).

    Args:
        dp_replicate_size: replicas (DDP-like) along the data-parallel dimension.
        dp_shard_size: FSDP shards along the data-parallel dimension.
        tp_size: tensor-parallel ranks (each holds a slice of every planned layer).
        cp_size: context parallelism: must be 1 (not built yet).
        tp_plan: module name (``fnmatch`` patterns allowed, e.g. ``"layers.*.fc1"``) ->
            ``"colwise"``, ``"rowwise"`` or ``"colwise_gather_output"`` (output gathered
            whole); ``None``: a transformers model's ``config.base_model_tp_plan``, else the
            model's own ``tp_plan``.

    Raises:
        ConfigError: a size below 1, context parallelism, or a plan style other than
            colwise/rowwise.

    Example:
        >>> ParallelismConfig(tp_size=2).tp_size
        2
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    tp_plan: dict[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"):
            _size(name, getattr(self, name))
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
    names = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "tp_plan")
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
