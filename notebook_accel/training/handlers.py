"""Keyword-argument handlers: small dataclasses that carry options for one component.

accelerate's pattern, kept by name: ``Accelerator(kwargs_handlers=[SomeKwargs(...)])``. Each
handler is a dataclass; :meth:`KwargsHandler.to_kwargs` returns only the fields the user set
(those that differ from the defaults), so the component's own defaults stay in force.

Handlers here: ``DistributedDataParallelKwargs`` (DDP's options and communication hook),
``GradScalerKwargs`` (fp16's GradScaler), ``InitProcessGroupKwargs`` (the process group the
Accelerator creates), ``AutocastKwargs`` (Accelerator.autocast) and
``GradientAccumulationPlugin`` (accelerate's carrier of the accumulation steps). A new kind
is a ``@dataclass`` subclass of :class:`KwargsHandler` that the component reads with
``Accelerator._handler(Kind)``.

Example:
    >>> from datetime import timedelta
    >>> from notebook_accel import Accelerator, InitProcessGroupKwargs
    >>> handler = InitProcessGroupKwargs(timeout=timedelta(minutes=5))
    >>> accelerator = Accelerator(kwargs_handlers=[handler])  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import ConfigError

__all__ = [
    "HandlerView",
    "Handlers",
    "AutocastKwargs",
    "GradientAccumulationPlugin",
    "KwargsHandler",
    "collect",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
]

H = TypeVar("H", bound="KwargsHandler")


class KwargsHandler:
    """Base class of the handlers: a dataclass whose set fields become keyword arguments."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from the dataclass defaults."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(default, f.name)
        }


class Handlers(dict[type, KwargsHandler]):
    """An Accelerator's ``kwargs_handlers``, by class: the one lookup of them."""

    def of(self, kind: type[H]) -> H | None:
        """The entry of class ``kind``, if the user gave one."""
        return self.get(kind)  # type: ignore[return-value]

    def kwargs(self, kind: type[KwargsHandler]) -> dict[str, Any]:
        """The options the user set in the ``kind`` handler (``{}`` without one)."""
        handler = self.get(kind)
        return handler.to_kwargs() if handler is not None else {}

    def named(self, name: str) -> KwargsHandler | None:
        """The entry whose class is called ``name`` (a handler of a module loaded only when
        used, such as fp8's AORecipeKwargs)."""
        return next((h for kind, h in self.items() if kind.__name__ == name), None)


class HandlerView:
    """accelerate's Accelerator attributes for its ``kwargs_handlers``, said once: each the
    handler of that kind the user gave, or None (the component's defaults then apply)."""

    _handlers: Handlers

    @property
    def ddp_handler(self) -> DistributedDataParallelKwargs | None:
        """The ``DistributedDataParallelKwargs`` given, or None."""
        return self._handlers.of(DistributedDataParallelKwargs)

    @property
    def scaler_handler(self) -> GradScalerKwargs | None:
        """The ``GradScalerKwargs`` given, or None."""
        return self._handlers.of(GradScalerKwargs)

    @property
    def init_handler(self) -> InitProcessGroupKwargs | None:
        """The ``InitProcessGroupKwargs`` given, or None."""
        return self._handlers.of(InitProcessGroupKwargs)

    @property
    def autocast_handler(self) -> AutocastKwargs | None:
        """The ``AutocastKwargs`` given, or None."""
        return self._handlers.of(AutocastKwargs)

    @property
    def te_recipe_handler(self) -> None:
        """None: Transformer Engine's ``TERecipeKwargs`` cannot be given here (refused)."""
        return None


def collect(handlers: Iterable[Any] | None) -> Handlers:
    """Validate ``kwargs_handlers`` and index them by class: at most one of each kind.

    Raises:
        ConfigError: an item that is not a handler, or two handlers of the same class.
    """
    found = Handlers()
    for i, handler in enumerate(handlers or ()):
        if not isinstance(handler, KwargsHandler):
            raise ConfigError(
                f"kwargs_handlers[{i}]",
                type(handler).__name__,
                "an instance of a KwargsHandler class (e.g. DistributedDataParallelKwargs)",
            )
        if type(handler) in found:
            raise ConfigError(
                f"kwargs_handlers[{i}]",
                type(handler).__name__,
                f"at most one {type(handler).__name__} in the list",
            )
        found[type(handler)] = handler
    return found


# ---- accelerate's handlers for DDP, the fp16 scaler and the process group ------------------


class DDPCommunicationHookType(enum.StrEnum):
    """A DDP communication hook, by accelerate's names (``"fp16"``, ``"power_sgd"``...)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


# Options of DistributedDataParallelKwargs that are ours to apply, not DDP's arguments.
_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options for ``torch.nn.parallel.DistributedDataParallel`` when a model is wrapped.

    The fields that differ from the defaults reach DDP (merged with ``Accelerator(ddp_kwargs=)``);
    ``comm_hook`` (optionally compressed by ``comm_wrapper``) is registered on the wrapped model.

    Example:
        >>> handler = DistributedDataParallelKwargs(find_unused_parameters=True)
        >>> handler.to_kwargs()
        {'find_unused_parameters': True}
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        names = ", ".join(repr(h.value) for h in DDPCommunicationHookType)
        for field in ("comm_hook", "comm_wrapper"):
            value = getattr(self, field)
            try:
                setattr(self, field, DDPCommunicationHookType(value))
            except ValueError:
                raise ConfigError(
                    f"DistributedDataParallelKwargs.{field}", value, f"one of {names}"
                ) from None

    def to_kwargs(self) -> dict[str, Any]:
        """DDP's keyword arguments: the set fields, without the hook options."""
        return {k: v for k, v in super().to_kwargs().items() if k not in _HOOK_FIELDS}

    def register_comm_hook(self, model: Any) -> None:
        """Register ``comm_hook`` (wrapped by ``comm_wrapper``) on a DDP ``model``."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        kind = DDPCommunicationHookType(self.comm_hook)
        wrap = DDPCommunicationHookType(self.comm_wrapper)
        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        hook: Any = hooks.get(kind)
        if hook is None:
            return
        if wrap in wrappers:
            hook = wrappers[wrap](hook)
        power_sgd = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
        state = (
            powerSGD_hook.PowerSGDState(None, **self.comm_state_option)
            if kind in power_sgd
            else None
        )
        model.register_comm_hook(state=state, hook=hook)


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Options for fp16's ``torch.amp.GradScaler``.

    Example:
        >>> GradScalerKwargs(init_scale=1024.0).to_kwargs()
        {'init_scale': 1024.0}
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options for ``torch.distributed.init_process_group`` when the Accelerator creates the group.

    Unset fields keep our choices: the launch's backend for the device (``gloo`` on CPU,
    ``nccl`` on CUDA), ``init_method="env://"`` and torch's default timeout. (accelerate's
    defaults are ``backend="nccl"`` and a timeout derived from it; neither reaches
    ``init_process_group`` unless changed, so the effect is the same.) A group that exists
    already (a second Accelerator in one process) is reused unchanged.

    Example:
        >>> InitProcessGroupKwargs(timeout=timedelta(seconds=60)).to_kwargs()
        {'timeout': datetime.timedelta(seconds=60)}
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            raise ConfigError(
                "InitProcessGroupKwargs.timeout",
                self.timeout,
                "a datetime.timedelta, e.g. timedelta(minutes=30), or None",
            )


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` in :meth:`Accelerator.autocast`.

    Given to ``accelerator.autocast(autocast_handler=...)`` (or in ``kwargs_handlers``, the
    default for that call): ``enabled=False`` runs the block in full precision inside a
    mixed-precision forward, as accelerate's does.

    Example:
        >>> AutocastKwargs(enabled=False).to_kwargs()
        {'enabled': False}
    """

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """accelerate's ``Accelerator(gradient_accumulation_plugin=...)``: the accumulation steps.

    ``num_steps`` is ``gradient_accumulation_steps``; the scheduler follows the optimizer's
    real steps and a loader's last batch ends a cycle (accelerate's defaults, the only
    behaviour here: other values of ``adjust_scheduler``, ``sync_with_dataloader`` or
    ``sync_each_batch`` are refused by the Accelerator).

    Example:
        >>> GradientAccumulationPlugin(num_steps=4).num_steps
        4
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
