"""The Accelerator's options, settled in one place before anything else happens.

    Accelerator(...) arguments
      -> None: the launch's choice (launched.option: the LaunchConfig a rank was given)
      -> accelerate's other spellings, one of each pair: fsdp_plugin=, dynamo_plugin=,
         dataloader_config= (split_batches=, even_batches=)
      -> each value's own checks (FsdpConfig, DeepSpeedPlugin, ParallelismConfig, ...)
      -> options/rules.py: how they combine (one way of sharding, no compile with one),
         written once for the launcher and the Accelerator
    Choices: the settled values; once the process state is known, Choices.check_size
    (FSDP in one process, a mesh the job does not fill: rules.sized)

Lightning Fabric's ``_Connector`` does this job for ``Fabric(...)``; the Accelerator keeps the
settled values and builds its parts from them.
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass
from typing import Any

from .. import env, launched, refusals
from ..errors import ConfigError
from ..options import rules
from ..options.deepspeed import DeepSpeedPlugin
from ..options.dynamo import TorchDynamoPlugin, check_backend
from ..options.fsdp import FsdpConfig
from ..options.parallelism import ParallelismConfig
from . import strategies
from .data.config import DataLoaderConfiguration
from .data.rng import RNG_TYPES
from .handlers import (
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    Handlers,
    InitProcessGroupKwargs,
    KwargsHandler,
    collect,
)
from .precision import check_precision, make_precision
from .precision.modes import Precision
from .process import GradientState, ProcessState
from .project import ProjectConfiguration
from .strategies import Strategy

__all__ = ["OPTIONS", "Choices", "accumulation_steps", "settle"]


@dataclass(frozen=True)
class Choices:
    """An Accelerator's options, validated together."""

    precision: str
    fsdp: FsdpConfig | None
    deepspeed: DeepSpeedPlugin | None
    mesh: ParallelismConfig | None
    dynamo: TorchDynamoPlugin
    accumulation_steps: int
    project: ProjectConfiguration
    dataloader: DataLoaderConfiguration
    step_scheduler_with_optimizer: bool
    rng_types: list[str]
    handlers: Handlers
    ddp_kwargs: dict[str, Any]

    def process_state(self, cpu: bool) -> ProcessState:
        """This process's facts (its group joined), checked against the options that need a
        job of some size (rules.sized: FSDP in one process, a mesh the job does not fill)."""
        group_options = self.handlers.kwargs(InitProcessGroupKwargs)
        state = ProcessState.from_environment(cpu=cpu, group_options=group_options)
        rules.sized(
            state.world_size,
            fsdp=None if self.fsdp is None else self.fsdp.sharding_strategy,
            mesh=None if self.mesh is None else self.mesh.sizes(),
            names=rules.ACCELERATOR,
        )
        return state

    def precision_for(self, state: ProcessState) -> Precision:
        """The precision object for this process's device."""
        # An XLA job's precision (graph cut per step, gradients averaged across device threads)
        # follows the job's backend, whatever device object torch_xla hands out.
        kind = "xla" if state.backend == "xla" else state.device.type
        return make_precision(
            self.precision,
            kind,
            self.handlers.kwargs(GradScalerKwargs),
            self.handlers.named("AORecipeKwargs"),  # fp8.py loads only for fp8
            state.device,
            loss_scaler=self.deepspeed is None,  # DeepSpeed scales fp16 losses itself
        )

    def strategy_for(self, state: ProcessState, gradient_state: GradientState) -> Strategy:
        """How models are spread over the processes (strategies.select)."""
        return strategies.select(
            state,
            fsdp=self.fsdp,
            ddp_kwargs=self.ddp_kwargs,
            ddp_handler=self.handlers.of(DistributedDataParallelKwargs),
            deepspeed=self.deepspeed,
            gradient_state=gradient_state,
            mixed_precision=self.precision,
            split_batches=self.dataloader.split_batches,
            parallelism=self.mesh,
        )


def settle(
    *,
    mixed_precision: object,
    gradient_accumulation_steps: int | None,
    gradient_accumulation_plugin: object,
    fsdp: object,
    fsdp_plugin: object,
    deepspeed_plugin: object,
    deepspeed_plugins: object,
    torch_tp_plugin: object,
    megatron_lm_plugin: object,
    parallelism_config: object,
    dynamo_backend: object,
    dynamo_plugin: object,
    project_dir: str | os.PathLike[str] | None,
    project_config: object,
    dataloader_config: object,
    split_batches: bool | None,
    even_batches: bool | None,
    step_scheduler_with_optimizer: object,
    rng_types: list[str] | None,
    kwargs_handlers: list[KwargsHandler] | None,
    ddp_kwargs: dict[str, Any] | None,
) -> Choices:
    """Every option of ``Accelerator(...)`` that needs settling, or the ConfigError naming it.

    Raises:
        ConfigError: a value outside what its option accepts, or options that do not go
            together (options/rules.py).
    """
    refusals.refuse_given("Accelerator", megatron_lm_plugin=megatron_lm_plugin)
    if mixed_precision is None:
        mixed_precision = launched.option("mixed_precision") or "no"
    precision = check_precision(mixed_precision)
    if precision == "fp8" and env.fp8_backend() == "TE":
        where = "mixed_precision='fp8' with ACCELERATE_FP8_BACKEND=TE"
        raise refusals.refuse(where, refusals.TRANSFORMER_ENGINE)
    fsdp = _fsdp_plugin(fsdp, fsdp_plugin)
    fsdp_config = FsdpConfig.coerce(launched.option("fsdp") if fsdp is None else fsdp)
    plugin = _deepspeed_plugin(_one_deepspeed_plugin(deepspeed_plugin, deepspeed_plugins))
    mesh = _mesh(parallelism_config if parallelism_config is not None else _tp(torch_tp_plugin))
    gradient_accumulation_steps = _accumulation_plugin(
        gradient_accumulation_plugin, gradient_accumulation_steps
    )
    if gradient_accumulation_steps is None and plugin is not None:
        gradient_accumulation_steps = plugin.accumulation_steps
    steps = accumulation_steps(gradient_accumulation_steps)
    dynamo = _dynamo_choice(dynamo_backend, dynamo_plugin)
    rules.together(
        fsdp=fsdp_config,
        deepspeed=plugin,
        mesh=None if mesh is None else mesh.sizes(),
        dynamo_backend=dynamo.backend.value.lower() if dynamo.enabled else "no",
        names=rules.ACCELERATOR,
    )
    if plugin is not None:
        rules.deepspeed_installed("deepspeed_plugin", plugin)
    if project_config is not None and not isinstance(project_config, ProjectConfiguration):
        raise ConfigError("project_config", project_config, "a ProjectConfiguration or None")
    project = project_config or ProjectConfiguration()
    if project_dir is not None:
        project.set_directories(project_dir)
    handlers = collect(kwargs_handlers)
    data = _data_config(dataloader_config, split_batches, even_batches)
    if not isinstance(step_scheduler_with_optimizer, bool):
        raise ConfigError(
            "step_scheduler_with_optimizer", step_scheduler_with_optimizer, "True or False"
        )
    ddp = _ddp_kwargs(handlers, ddp_kwargs)
    return Choices(
        precision=precision,
        fsdp=fsdp_config,
        deepspeed=plugin,
        mesh=mesh,
        dynamo=dynamo,
        accumulation_steps=steps,
        project=project,
        dataloader=data,
        step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        rng_types=_rng_types(rng_types),
        handlers=handlers,
        ddp_kwargs=ddp,
    )


def _accumulation_plugin(plugin: object, steps: int | None) -> int | None:
    """accelerate's ``gradient_accumulation_plugin``: its ``num_steps``, alone, with the
    behaviour this Accelerator has (accelerate's defaults for the other fields)."""
    if plugin is None:
        return steps
    if not isinstance(plugin, GradientAccumulationPlugin):
        raise ConfigError(
            "gradient_accumulation_plugin", plugin, "a GradientAccumulationPlugin or None"
        )
    if steps is not None:
        raise ConfigError(
            "gradient_accumulation_steps",
            steps,
            "None when gradient_accumulation_plugin is given (set num_steps there)",
        )
    defaults = GradientAccumulationPlugin()
    for name in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
        if getattr(plugin, name) != getattr(defaults, name):
            raise ConfigError(
                f"GradientAccumulationPlugin({name}=...)",
                getattr(plugin, name),
                f"{getattr(defaults, name)!r} (the only behaviour notebook_accel has)",
            )
    return plugin.num_steps


def accumulation_steps(value: int | None) -> int:
    """Micro-batches per optimizer step (``None``: the launcher's, else 1)."""
    if value is None:
        value = launched.option("gradient_accumulation_steps") or 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("gradient_accumulation_steps", value, "an int >= 1")
    return value


def _rng_types(value: list[str] | None) -> list[str]:
    if value is None:
        return ["generator"]
    # accelerate's RNGType members are str enums: take their values.
    names = [getattr(v, "value", v) for v in value] if isinstance(value, list | tuple) else None
    if names is None or any(n not in RNG_TYPES for n in names):
        raise ConfigError("rng_types", value, "a list of " + ", ".join(map(repr, RNG_TYPES)))
    return [str(n) for n in names]


def _fsdp_plugin(fsdp: object, plugin: object) -> Any:
    """``fsdp=``, or accelerate's ``fsdp_plugin=`` (a FullyShardedDataParallelPlugin(...))."""
    if plugin is None:
        return fsdp
    if fsdp is not None:
        raise ConfigError("fsdp_plugin", plugin, "one of fsdp= and fsdp_plugin=")
    if not isinstance(plugin, FsdpConfig):
        raise ConfigError("fsdp_plugin", plugin, "a FullyShardedDataParallelPlugin(...) or None")
    return plugin


def _deepspeed_plugin(value: object) -> DeepSpeedPlugin | None:
    """The plugin given, or the launch's (``notebook_launcher(deepspeed=...)``)."""
    if value is None:
        fields = launched.option("deepspeed")
        value = DeepSpeedPlugin(**fields) if fields is not None else None
    if value is not None and not isinstance(value, DeepSpeedPlugin):
        raise ConfigError("deepspeed_plugin", value, "a DeepSpeedPlugin or None")
    return value


def _one_deepspeed_plugin(plugin: object, plugins: object) -> object:
    """accelerate's two spellings, ``deepspeed_plugin`` and ``deepspeed_plugins``: a plugin,
    or a dict of named plugins (one here: several, switched with accelerate's
    ``select_deepspeed_plugin``, are not built)."""
    if plugin is not None and plugins is not None:
        raise ConfigError(
            "deepspeed_plugins", plugins, "None when deepspeed_plugin is given (one of the two)"
        )
    value = plugins if plugin is None else plugin
    if isinstance(value, dict):
        name = "deepspeed_plugins" if plugin is None else "deepspeed_plugin"
        if len(value) != 1:
            raise ConfigError(
                name,
                sorted(value),
                "one named DeepSpeedPlugin (several plugins in one Accelerator, switched with "
                "select_deepspeed_plugin, are not built)",
            )
        (value,) = value.values()
    return value


def _tp(plugin: object) -> ParallelismConfig | None:
    """accelerate's deprecated ``torch_tp_plugin`` (a ``TorchTensorParallelPlugin``): its
    ``tp_size`` as a ParallelismConfig, with accelerate's FutureWarning."""
    if plugin is None:
        return None
    size = getattr(plugin, "tp_size", None)
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError("torch_tp_plugin", plugin, "a TorchTensorParallelPlugin(tp_size=...)")
    warnings.warn(
        "TorchTensorParallelPlugin is deprecated (as in accelerate): use "
        f"parallelism_config=ParallelismConfig(tp_size={size}).",
        FutureWarning,
        stacklevel=4,  # the user's Accelerator(...)
    )
    return ParallelismConfig(tp_size=size)


def _mesh(value: object) -> ParallelismConfig | None:
    """The ParallelismConfig given, or the launch's (``notebook_launcher(parallelism_config=)``)."""
    if value is None and launched.option("parallelism_config") is not None:
        value = ParallelismConfig(**launched.option("parallelism_config"))
    if value is not None and not isinstance(value, ParallelismConfig):
        raise ConfigError("parallelism_config", value, "a ParallelismConfig")
    return value


def _dynamo_choice(backend: object, plugin: object) -> TorchDynamoPlugin:
    """One TorchDynamoPlugin from ``dynamo_backend`` or ``dynamo_plugin`` (or the launch's)."""
    if plugin is not None and not isinstance(plugin, TorchDynamoPlugin):
        raise ConfigError("dynamo_plugin", plugin, "a TorchDynamoPlugin or None")
    if plugin is not None and backend is not None:
        raise ConfigError(
            "dynamo_backend",
            backend,
            "None when dynamo_plugin is given",
            "Set the backend in the TorchDynamoPlugin.",
        )
    if plugin is not None:
        return plugin
    if backend is None and launched.option("dynamo_backend") not in (None, "no"):
        backend = launched.option("dynamo_backend")  # the launch's, over the variables
    if backend is not None:
        return TorchDynamoPlugin(backend=check_backend("dynamo_backend", backend))
    return TorchDynamoPlugin()


def _data_config(
    config: object, split_batches: bool | None, even_batches: bool | None
) -> DataLoaderConfiguration:
    """One DataLoaderConfiguration from ``dataloader_config`` or the two direct arguments."""
    if config is not None and not isinstance(config, DataLoaderConfiguration):
        raise ConfigError("dataloader_config", config, "a DataLoaderConfiguration or None")
    if config is not None and (split_batches is not None or even_batches is not None):
        raise ConfigError(
            "split_batches/even_batches",
            (split_batches, even_batches),
            "None when dataloader_config is given",
            "Set them in the DataLoaderConfiguration.",
        )
    if config is not None:
        return config
    return DataLoaderConfiguration(
        split_batches=False if split_batches is None else split_batches,
        even_batches=True if even_batches is None else even_batches,
    )


def _ddp_kwargs(handlers: Handlers, ddp_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``ddp_kwargs`` merged with a DistributedDataParallelKwargs handler's (no key twice)."""
    from_handler = handlers.kwargs(DistributedDataParallelKwargs)
    clash = sorted(set(from_handler) & set(ddp_kwargs or {}))
    if clash:
        raise ConfigError(
            "ddp_kwargs",
            {k: (ddp_kwargs or {})[k] for k in clash},
            "keys not also set by the DistributedDataParallelKwargs handler",
        )
    return {**from_handler, **(ddp_kwargs or {})}


# The Accelerator's arguments that settle() takes, by name.
OPTIONS = frozenset(inspect.signature(settle).parameters)
