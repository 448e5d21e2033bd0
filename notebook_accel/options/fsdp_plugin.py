"""FullyShardedDataParallelPlugin: accelerate's constructor for our FSDP settings.

    FullyShardedDataParallelPlugin(**accelerate's fields)  ->  FsdpConfig
        sharding_strategy / reshard_after_forward    -> sharding_strategy
        auto_wrap_policy + transformer_cls_names_to_wrap / min_num_params
                                                     -> auto_wrap_classes / min_num_params
        cpu_offload (bool, CPUOffload, CPUOffloadPolicy) -> cpu_offload
        mixed_precision_policy (str, dict, torch's)  -> param_dtype, reduce_dtype
        sync_module_states                           -> sync_module_states
        activation_checkpointing(_offload)           -> the same fields (FSDP2 units'
                                                        forward checkpointed)
        fsdp_version None or 2, the state-dict fields (checkpoints: see the README), and the
        FSDP1 knobs at their defaults                -> accepted
        anything else                                -> ConfigError naming the field

Models are sharded with FSDP2 (``fully_shard``) whatever ``fsdp_version`` says by default;
``Accelerator(fsdp_plugin=...)`` takes the result, as ``Accelerator(fsdp=...)`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..errors import ConfigError
from .fsdp import DTYPES, FsdpConfig, ShardingStrategy

__all__ = ["FullyShardedDataParallelPlugin"]

# torch's ShardingStrategy names (and their values 1-4) -> ours; ZeRO-2 hybrid has no FSDP2 form
_STRATEGIES: dict[str, ShardingStrategy] = {
    "FULL_SHARD": "full",
    "SHARD_GRAD_OP": "grad_op",
    "NO_SHARD": "no_shard",
    "HYBRID_SHARD": "hybrid",
    "1": "full",
    "2": "grad_op",
    "3": "no_shard",
    "4": "hybrid",
}
_WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT")


def _refuse(field: str, value: object, accepted: str) -> ConfigError:
    return ConfigError(f"FullyShardedDataParallelPlugin({field})", value, accepted)


def _strategy(field: str, value: object) -> ShardingStrategy:
    name = getattr(value, "name", value)  # torch's enum member, or its name / number
    key = str(name).upper() if isinstance(name, str | int) and not isinstance(name, bool) else ""
    if key not in _STRATEGIES:
        raise _refuse(field, value, "one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD")
    return _STRATEGIES[key]


def _dtype(field: str, value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        names = [n for n, d in DTYPES.items() if d == value]
        if names:
            return names[0]
    if isinstance(value, str) and value in DTYPES:
        return value
    raise _refuse(field, value, "torch.float32, torch.bfloat16, torch.float16 or their names")


def _precision(value: object) -> tuple[str | None, str | None]:
    """(param_dtype, reduce_dtype) from a name, a dict or torch's MixedPrecision(Policy)."""
    field = "mixed_precision_policy"
    if value is None:
        return None, None
    if isinstance(value, str):
        return _dtype(field, value), _dtype(field, value)
    if isinstance(value, Mapping):
        fields = dict(value)
    else:
        fields = {
            k: getattr(value, k)
            for k in ("param_dtype", "reduce_dtype", "buffer_dtype")
            if hasattr(value, k)
        }
        if not fields:
            raise _refuse(field, value, "a dtype name, a dict or torch's MixedPrecision(Policy)")
    unknown = sorted(set(fields) - {"param_dtype", "reduce_dtype", "buffer_dtype"})
    if unknown:
        raise _refuse(f"{field}[{unknown[0]!r}]", fields[unknown[0]], "param/reduce/buffer_dtype")
    param = _dtype(f"{field}.param_dtype", fields.get("param_dtype"))
    buffer = _dtype(f"{field}.buffer_dtype", fields.get("buffer_dtype"))
    if buffer not in (None, param):  # FSDP2 keeps buffers as they are stored
        raise _refuse(f"{field}.buffer_dtype", fields.get("buffer_dtype"), "None or param_dtype")
    return param, _dtype(f"{field}.reduce_dtype", fields.get("reduce_dtype"))


def _offload(value: object) -> bool:
    if isinstance(value, bool):
        return value
    kind = type(value).__name__
    if kind == "CPUOffload":
        return bool(getattr(value, "offload_params", False))
    if kind == "CPUOffloadPolicy":
        return True
    if kind == "OffloadPolicy":
        return False
    raise _refuse("cpu_offload", value, "a bool, torch's CPUOffload or CPUOffloadPolicy")


def _state_dict_type(value: object) -> None:
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name.upper() not in _STATE_DICT_TYPES:
        raise _refuse("state_dict_type", value, "one of " + ", ".join(_STATE_DICT_TYPES))


def FullyShardedDataParallelPlugin(  # noqa: C901 - one check per accelerate field, in order
    fsdp_version: int | None = None,
    sharding_strategy: Any = None,
    reshard_after_forward: Any = None,
    backward_prefetch: Any = None,
    mixed_precision_policy: Any = None,
    auto_wrap_policy: str | Callable[..., Any] | None = None,
    cpu_offload: Any = False,
    ignored_modules: Iterable[torch.nn.Module] | str | None = None,
    state_dict_type: Any = None,
    state_dict_config: Any = None,
    optim_state_dict_config: Any = None,
    limit_all_gathers: bool = True,
    use_orig_params: bool | None = None,
    param_init_fn: Callable[[torch.nn.Module], None] | None = None,
    sync_module_states: bool | None = None,
    forward_prefetch: bool = False,
    activation_checkpointing: bool = False,
    activation_checkpointing_offload: bool | None = None,
    cpu_ram_efficient_loading: bool | None = None,
    transformer_cls_names_to_wrap: list[str] | None = None,
    min_num_params: int | None = None,
) -> FsdpConfig:
    """accelerate's FSDP plugin, by its field names: the :class:`FsdpConfig` they describe.

    The fields that have an FSDP2 meaning map (module docstring); ``state_dict_type``,
    ``state_dict_config`` and ``optim_state_dict_config`` are accepted and leave our
    checkpoints as they are (``save_state`` writes sharded DCP files; ``get_state_dict`` the
    whole dict on the main process). FSDP1-only knobs are accepted at their defaults.

    Raises:
        ConfigError: a field without an FSDP2 counterpart set away from its default
            (``fsdp_version=1``, ``backward_prefetch``, ``forward_prefetch``,
            ``ignored_modules``, ``param_init_fn``,
            ``cpu_ram_efficient_loading``, ``use_orig_params=False``,
            ``limit_all_gathers=False``, a callable ``auto_wrap_policy``), or a bad value.

    Example:
        >>> FullyShardedDataParallelPlugin(
        ...     reshard_after_forward=False, mixed_precision_policy="bf16"
        ... )  # doctest: +ELLIPSIS
        FsdpConfig(sharding_strategy='grad_op', ..., param_dtype='bf16', reduce_dtype='bf16', ...)
    """
    if fsdp_version not in (None, 2):
        raise _refuse("fsdp_version", fsdp_version, "2 or None (models are sharded with FSDP2)")
    unmapped = {
        "backward_prefetch": (backward_prefetch, (None, "NO_PREFETCH")),
        "limit_all_gathers": (limit_all_gathers, (True,)),
        "use_orig_params": (use_orig_params, (None, True)),
        "param_init_fn": (param_init_fn, (None,)),
        "forward_prefetch": (forward_prefetch, (False,)),
        "cpu_ram_efficient_loading": (cpu_ram_efficient_loading, (None, False)),
        "ignored_modules": (ignored_modules, (None,)),
    }
    for field, (value, defaults) in unmapped.items():
        if not any(value is d or (isinstance(d, str) and value == d) for d in defaults):
            raise _refuse(
                field,
                value,
                " or ".join(repr(d) for d in defaults) + " (no FSDP2 counterpart here)",
            )
    strategy: ShardingStrategy = "full"
    if sharding_strategy is not None:
        strategy = _strategy("sharding_strategy", sharding_strategy)
    if isinstance(reshard_after_forward, bool):
        if reshard_after_forward is False and strategy == "full":
            strategy = "grad_op"
        elif reshard_after_forward is True and strategy == "grad_op":
            raise _refuse(
                "reshard_after_forward", True, "False with sharding_strategy=SHARD_GRAD_OP"
            )
    elif reshard_after_forward is not None:
        strategy = _strategy("reshard_after_forward", reshard_after_forward)
    classes: tuple[str, ...] = ()
    size = 0
    if callable(auto_wrap_policy):
        raise _refuse("auto_wrap_policy", auto_wrap_policy, "one of " + ", ".join(_WRAP_POLICIES))
    if auto_wrap_policy not in (None, *_WRAP_POLICIES):
        raise _refuse("auto_wrap_policy", auto_wrap_policy, "one of " + ", ".join(_WRAP_POLICIES))
    if auto_wrap_policy == "transformer_based_wrap":
        if not transformer_cls_names_to_wrap:
            raise _refuse(
                "transformer_cls_names_to_wrap",
                transformer_cls_names_to_wrap,
                "the layer class names to wrap (auto_wrap_policy='transformer_based_wrap')",
            )
        names = transformer_cls_names_to_wrap
        classes = (names,) if isinstance(names, str) else tuple(names)
    elif auto_wrap_policy == "size_based_wrap":
        if isinstance(min_num_params, bool) or not isinstance(min_num_params, int):
            raise _refuse("min_num_params", min_num_params, "an int >= 1 with size_based_wrap")
        if min_num_params < 1:
            raise _refuse("min_num_params", min_num_params, "an int >= 1 with size_based_wrap")
        size = min_num_params
    if state_dict_type is not None:
        _state_dict_type(state_dict_type)
    for field, config in (
        ("state_dict_config", state_dict_config),
        ("optim_state_dict_config", optim_state_dict_config),
    ):
        if config is not None and not type(config).__name__.endswith("StateDictConfig"):
            raise _refuse(field, config, "torch's Full/Sharded(Optim)StateDictConfig or None")
    param, reduce = _precision(mixed_precision_policy)
    checkpointing = {
        "activation_checkpointing": bool(activation_checkpointing),
        "activation_checkpointing_offload": bool(activation_checkpointing_offload),
    }
    return FsdpConfig(
        **checkpointing,
        sharding_strategy=strategy,
        auto_wrap_classes=classes,
        min_num_params=size,
        cpu_offload=_offload(cpu_offload),
        param_dtype=param,  # type: ignore[arg-type]
        reduce_dtype=reduce,  # type: ignore[arg-type]
        sync_module_states=True if sync_module_states is None else bool(sync_module_states),
    )
