"""DeepSpeedPlugin: accelerate's description of a DeepSpeed run, validated, torch-free.

    DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=..., hf_ds_config=...)
        -> validated at construction (ConfigError naming the field and what is accepted)
        -> ds_config(...): DeepSpeed's config dict with every ``"auto"`` filled from the
           Accelerator's settings (accumulation, mixed precision, clipping) and the first
           prepared loader's batch size; used by ``training/strategies/deepspeed.py``

The config file may be a JSON path or a dict (``hf_ds_config``, as accelerate calls it);
then ``zero_stage`` and the other fields, where given, override what the file says.

ZeRO-3 (see ``zero3_init_context_manager``): a model built inside the plugin's context is
partitioned as each layer is made (``deepspeed.zero.Init`` with this plugin's filled config),
so no rank ever holds the whole model; ``training/strategies/deepspeed.py`` binds the Accelerator's
settings to the plugin for that config.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..private import torch as private_torch

__all__ = [
    "DeepSpeedPlugin",
    "ZERO_STAGES",
    "OFFLOAD_DEVICES",
    "coerce_option",
]

ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# ZeRO's sizes that accelerate fills from a transformers model's hidden size h when "auto".
_HIDDEN_SIZED = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}
# Ours besides, on CPU only (accelerate leaves them to DeepSpeed, whose defaults are tuned
# for GPUs): its 1e9 elements keep every gathered parameter alive from forward to backward
# and run Adam over the whole partition at once (temporaries of twice its size), which on
# CPU cost more than the partitioning saved; one largest layer's worth each bounds both.
_OURS_SIZED = {
    "sub_group_size": lambda h: h * h,
    "stage3_max_live_parameters": lambda h: 4 * h * h,
    "stage3_max_reuse_distance": lambda h: h * h,
}
# DeepSpeed's own values, for a config needed before any model exists (zero.Init's).
_DEEPSPEED_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "sub_group_size": 1_000_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}


def _read_config(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return copy.deepcopy(value)
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                "hf_ds_config", os.fspath(value), f"a readable DeepSpeed JSON file ({err})"
            ) from err
        if not isinstance(loaded, dict):
            raise ConfigError("hf_ds_config", os.fspath(value), "a JSON object")
        return loaded
    raise ConfigError("hf_ds_config", value, "a dict, a path to a JSON file, or None")


@dataclass
class DeepSpeedPlugin:
    """Train with DeepSpeed's ZeRO (accelerate's ``DeepSpeedPlugin`` names).

    Args:
        hf_ds_config: a DeepSpeed config (dict or JSON file path); ``"auto"`` values are
            filled from the Accelerator's settings.
        gradient_accumulation_steps: micro-batches per step; ``None``/``"auto"``: the
            Accelerator's.
        gradient_clipping: max gradient norm DeepSpeed clips to in its step; ``None``: the
            config's (none).
        zero_stage: 0, 1, 2 or 3; ``None``: the config's, else 2 (accelerate's default).
        is_train_batch_min: the config's ``"auto"`` micro-batch is the smallest batch size of
            the loaders prepared with the model (``False``: the largest), as accelerate's.
        offload_optimizer_device: ``"none"``, ``"cpu"`` or ``"nvme"`` (ZeRO 1-3).
        offload_param_device: ``"none"``, ``"cpu"`` or ``"nvme"`` (ZeRO 3).
        offload_optimizer_nvme_path: the folder ``"nvme"`` offloads optimizer state to.
        offload_param_nvme_path: the folder ``"nvme"`` offloads parameters to. NVMe offload
            needs DeepSpeed's ``async_io`` op (libaio): where DeepSpeed has not built it,
            the Accelerator refuses ``"nvme"`` by name.
        zero3_init_flag: build models partitioned (ZeRO-3 only; ``None``: on at stage 3, as
            in accelerate); see :meth:`zero3_init_context_manager`.
        zero3_save_16bit_model: accepted for accelerate's signature (``save_model`` always
            gathers the whole state dict).
        transformer_moe_cls_names: comma-separated class names of a model's mixture-of-experts
            blocks (``"MixtralSparseMoeBlock"``): ZeRO-3 gathers each as one leaf
            (``deepspeed.utils.set_z3_leaf_modules``), as accelerate's.
        config: (ours, keyword-only) the config as read; filled at construction.

    A config's ``"optimizer"``/``"scheduler"`` sections are built by DeepSpeed: prepare a
    ``DummyOptim``/``DummyScheduler`` (``notebook_accel.utils``) for them, as with accelerate.

    Raises:
        ConfigError: a field outside its accepted values.

    Example:
        >>> plugin = DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=2)
        >>> plugin.zero_stage
        3
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    config: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)
    # The Accelerator's settings (training/strategies/deepspeed.py binds them): zero.Init's config.
    _settings: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.config = _read_config(self.hf_ds_config)
        zero = self.config.setdefault("zero_optimization", {})
        if self.zero_stage is None:
            self.zero_stage = int(zero.get("stage", 2))
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise ConfigError("zero_stage", self.zero_stage, "one of 0, 1, 2, 3")
        zero["stage"] = self.zero_stage
        self._offload(zero)
        if not isinstance(self.is_train_batch_min, bool):
            raise ConfigError("is_train_batch_min", self.is_train_batch_min, "True or False")
        names = self.transformer_moe_cls_names
        if names is not None and (not isinstance(names, str) or not names.strip()):
            raise ConfigError(
                "transformer_moe_cls_names", names, "comma-separated class names, or None"
            )
        _check_steps(self.gradient_accumulation_steps)
        clip = self.gradient_clipping
        if clip is not None:
            if isinstance(clip, bool) or not isinstance(clip, int | float) or clip < 0:
                raise ConfigError("gradient_clipping", clip, "a number >= 0 or None")
            self.config["gradient_clipping"] = float(clip)
        self._zero3_defaults(zero)

    def _offload(self, zero: dict[str, Any]) -> None:
        """The offload fields into ZeRO's config (the NVMe folders with ``"nvme"``)."""
        for name, key in (
            ("offload_optimizer_device", "offload_optimizer"),
            ("offload_param_device", "offload_param"),
        ):
            value = getattr(self, name)
            path = getattr(self, f"{key}_nvme_path")
            if path is not None and not isinstance(path, str | os.PathLike):
                raise ConfigError(f"{key}_nvme_path", path, "a folder path or None")
            if value is None:
                continue
            if value not in OFFLOAD_DEVICES:
                raise ConfigError(name, value, "one of " + ", ".join(map(repr, OFFLOAD_DEVICES)))
            if value != "none":
                zero.setdefault(key, {})["device"] = value
            if value == "nvme" and path is not None:
                zero[key]["nvme_path"] = os.fspath(path)

    def _zero3_defaults(self, zero: dict[str, Any]) -> None:
        if self.zero_stage == 3 and self.hf_ds_config is None:
            # No config of the user's: ZeRO-3's sizes follow the model (see ds_config).
            for key in (*_HIDDEN_SIZED, *_OURS_SIZED):
                zero.setdefault(key, "auto")
        if self.zero3_init_flag is None:
            self.zero3_init_flag = self.zero_stage == 3
        elif self.zero3_init_flag and self.zero_stage != 3:
            warnings.warn(
                "DeepSpeedPlugin: zero3_init_flag applies to ZeRO stage 3 only; it is off.",
                stacklevel=4,  # the user's DeepSpeedPlugin(...)
            )
            self.zero3_init_flag = False

    @property
    def offloads_to_nvme(self) -> bool:
        """Whether the config offloads optimizer state or parameters to NVMe."""
        zero = self.config.get("zero_optimization", {})
        return any(
            zero.get(key, {}).get("device") == "nvme"
            for key in ("offload_optimizer", "offload_param")
        )

    def moe_classes(self) -> list[str]:
        """The class names of ``transformer_moe_cls_names``, in order."""
        names = self.transformer_moe_cls_names or ""
        return [name.strip() for name in names.split(",") if name.strip()]

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built partitioned (``zero3_init_flag``), as in accelerate."""
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Build models partitioned (``enable=True``) or whole (``False``) inside the block.

        accelerate's name: its flag steers transformers' ``from_pretrained``. Here
        ``enable=True`` also partitions any ``torch.nn.Module`` built in the block, layer by
        layer as it is made (``deepspeed.zero.Init`` with this plugin's config, the
        Accelerator's precision), so no rank holds the whole model; ``prepare`` takes it as
        it is. ``enable=False`` builds whole (e.g. a frozen teacher model).

        Raises:
            ConfigError: ``enable=True`` before ``Accelerator(deepspeed_plugin=plugin)``, or
                at a ZeRO stage other than 3.

        Example:
            >>> plugin = accelerator.state.deepspeed_plugin  # doctest: +SKIP
            >>> with plugin.zero3_init_context_manager(enable=True):  # doctest: +SKIP
            ...     model = torch.nn.Linear(4096, 4096)  # each rank keeps half of it
        """
        old = self.zero3_init_flag
        self.zero3_init_flag = enable
        try:
            if not enable:
                yield
                return
            if self.zero_stage != 3:
                raise ConfigError(
                    "zero3_init_context_manager(enable=True)",
                    f"zero_stage={self.zero_stage}",
                    "ZeRO stage 3 (only stage 3 partitions parameters)",
                )
            with self.zero3_init():
                yield
        finally:
            self.zero3_init_flag = old

    def zero3_init(self) -> contextlib.AbstractContextManager[Any]:
        """``deepspeed.zero.Init`` with this plugin's config (the Accelerator's precision).

        Raises:
            ConfigError: the plugin is not an Accelerator's yet.
        """
        config = self.init_config()
        import deepspeed

        # zero.Init swaps torch.Tensor.__new__ while open; torch._dynamo checks that
        # signature when first imported (an optimizer's first use imports it) and fails.
        private_torch.import_dynamo()
        return deepspeed.zero.Init(config_dict_or_path=config)

    def init_config(self) -> dict[str, Any]:
        """The config ``deepspeed.zero.Init`` gets: this plugin's, with the Accelerator's
        settings, sizes at DeepSpeed's defaults (no model yet).

        Raises:
            ConfigError: the plugin is not an Accelerator's yet.
        """
        if self._settings is None:
            raise ConfigError(
                "deepspeed_plugin",
                "not given to an Accelerator yet",
                "Accelerator(deepspeed_plugin=plugin) before building the model in "
                "zero3_init_context_manager(enable=True)",
            )
        config = self.ds_config(**self._settings)
        # zero.Init reads its config before DeepSpeed's own view of the process group exists
        # (a world of 1 there): a train_batch_size for the job's world would not add up.
        del config["train_batch_size"]
        return config

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config as given (accelerate's name; ``"optimizer" in ...`` tells
        whether to prepare a ``DummyOptim``)."""
        return self.config

    @property
    def accumulation_steps(self) -> int | None:
        """The accumulation the plugin or its config fixes (``None``: the Accelerator's)."""
        steps = self.gradient_accumulation_steps
        if steps is None or steps == "auto":
            steps = self.config.get("gradient_accumulation_steps")
        return None if steps is None or steps == "auto" else int(steps)

    def ds_config(
        self,
        *,
        accumulation_steps: int,
        mixed_precision: str,
        micro_batch_size: int | None,
        world_size: int,
        hidden_size: int | None = None,
        device_type: str = "cpu",
        fill: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """DeepSpeed's config with every ``"auto"`` (and every missing required key) filled.

        Args:
            accumulation_steps: the Accelerator's gradient accumulation steps.
            mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
            micro_batch_size: the per-process batch size of the first prepared loader
                (``None``: 1, as when no loader was prepared).
            world_size: processes in the job (data-parallel size).
            hidden_size: the model's hidden size (a transformers model's ``config``) or, for
                other models, the square root of its largest parameter's size: ZeRO's
                ``"auto"`` bucket sizes follow it (``None``: DeepSpeed's defaults).
            device_type: where the job trains; ``sub_group_size``,
                ``stage3_max_live_parameters`` and ``stage3_max_reuse_distance`` follow the
                hidden size on CPU only (elsewhere ``"auto"`` there is DeepSpeed's default).
            fill: dotted keys (``"optimizer.params.lr"``) and the values that replace an
                ``"auto"`` there (a key the config lacks, or sets, is left alone): what
                ``DummyOptim``/``DummyScheduler`` give the config's sections.
        """
        cfg = copy.deepcopy(self.config)
        for dotted, value in (fill or {}).items():
            *path, key = dotted.split(".")
            node: Any = cfg
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(key) == "auto":
                node[key] = value
        zero = cfg.get("zero_optimization", {})
        _fill_sizes(zero, hidden_size, device_type)
        micro = cfg.get("train_micro_batch_size_per_gpu", "auto")
        if micro == "auto":
            micro = micro_batch_size or 1
        cfg["train_micro_batch_size_per_gpu"] = int(micro)
        cfg["gradient_accumulation_steps"] = accumulation_steps
        cfg["train_batch_size"] = int(micro) * accumulation_steps * world_size
        for name in ("fp16", "bf16"):
            section = cfg.setdefault(name, {})
            if section.get("enabled", "auto") == "auto":
                section["enabled"] = mixed_precision == name
        if cfg.get("gradient_clipping", "auto") == "auto":
            # DeepSpeed's own default clips to 1.0; unset means no clipping, as without it.
            cfg["gradient_clipping"] = 0.0
        # Our optimizers are torch's own: DeepSpeed refuses them under ZeRO without this.
        cfg.setdefault("zero_allow_untested_optimizer", True)
        cfg.setdefault("steps_per_print", 1 << 62)  # no progress lines of its own
        return _no_auto(cfg)


_FIELDS = (
    "hf_ds_config",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "is_train_batch_min",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "transformer_moe_cls_names",
)


def _fill_sizes(zero: dict[str, Any], hidden: int | None, device_type: str) -> None:
    # ZeRO's "auto" sizes: by the hidden size where a rule applies, else DeepSpeed's default.
    rules = {**_HIDDEN_SIZED, **(_OURS_SIZED if device_type == "cpu" else {})}
    for key, default in _DEEPSPEED_DEFAULTS.items():
        if zero.get(key) != "auto":
            continue
        rule = rules.get(key)
        zero[key] = default if hidden is None or rule is None else rule(hidden)


def coerce_option(value: object) -> dict[str, Any] | None:
    """A launch's ``deepspeed=`` as plugin fields (JSON types), validated by building the
    plugin: ``None``/``False`` (off), ``True`` (defaults: ZeRO-2), a ZeRO stage (int), a dict
    of :class:`DeepSpeedPlugin` fields, or a plugin.

    Raises:
        ConfigError: anything else, or a field outside its accepted values.

    Example:
        >>> coerce_option(3)
        {'zero_stage': 3}
    """
    if value is None or value is False:
        return None
    if value is True:
        fields: dict[str, Any] = {}
    elif isinstance(value, int) and not isinstance(value, bool):
        fields = {"zero_stage": value}
    elif isinstance(value, DeepSpeedPlugin):
        # the fields the user set: those away from their defaults
        defaults = {f.name: f.default for f in dataclass_fields(DeepSpeedPlugin)}
        fields = {k: getattr(value, k) for k in _FIELDS if getattr(value, k) != defaults[k]}
        if fields.get("zero3_init_flag") == (value.zero_stage == 3):
            del fields["zero3_init_flag"]  # the default the plugin resolved: not the user's
    elif isinstance(value, dict) and all(k in _FIELDS for k in value):
        fields = dict(value)
    else:
        raise ConfigError(
            "deepspeed",
            value,
            "None, True, a ZeRO stage (0-3), a DeepSpeedPlugin or a dict of its fields ("
            + ", ".join(_FIELDS)
            + ")",
        )
    for name in ("hf_ds_config", "offload_optimizer_nvme_path", "offload_param_nvme_path"):
        if isinstance(fields.get(name), os.PathLike):
            fields[name] = os.fspath(fields[name])
    DeepSpeedPlugin(**fields)  # validates every field
    try:
        json.dumps(fields)
    except TypeError as err:
        raise ConfigError("deepspeed", value, "JSON-serialisable fields") from err
    return fields


def _check_steps(steps: object) -> None:
    if steps is not None and steps != "auto":
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError("gradient_accumulation_steps", steps, 'an int >= 1 or "auto"')


def _no_auto(value: Any, where: str = "hf_ds_config") -> Any:
    # An "auto" we do not know how to fill is refused by name rather than left to DeepSpeed.
    if isinstance(value, dict):
        return {k: _no_auto(v, f"{where}[{k!r}]") for k, v in value.items()}
    if value == "auto":
        raise ConfigError(where, "auto", "a value: notebook_accel cannot fill this one")
    return value
