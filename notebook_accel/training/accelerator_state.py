"""accelerate's ``AcceleratorState``, ``GradientState`` and ``accelerate.state.is_initialized()``.

    Accelerator(...)   -> register(accelerator): this process's latest Accelerator's facts
    AcceleratorState() -> those facts (process state, precision, plugins, mesh); before any
                          Accelerator, a ValueError, as accelerate's
    GradientState()    -> its gradient state (sync_gradients, num_steps, ...), or a fresh one
    is_initialized()   -> an Accelerator was made in this process

accelerate keeps these in Borg dicts that every instance shares. Here the Accelerator stays
the owner of its facts: ``register`` keeps the small, fixed ones (its ProcessState, precision
name, plugins, gradient record) and a weak reference for the mesh, so the Accelerator and its
prepared models are freed as usual, while ``AcceleratorState()`` still answers afterwards (as
accelerate's does). Library code such as transformers' reads
``AcceleratorState().mixed_precision`` inside a user's function. A worker is a fresh process
for each launch, so nothing carries from one launch to the next.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from .. import launched
from .handlers import GradientAccumulationPlugin
from .processes import PartialState
from .state import DistributedType, ProcessState
from .state import GradientState as _Record

__all__ = ["AcceleratorState", "GradientState", "is_initialized", "register"]


@dataclass(frozen=True)
class _Facts:
    """What an Accelerator fixed at construction, kept for AcceleratorState()."""

    state: ProcessState
    distributed_type: DistributedType
    mixed_precision: str
    deepspeed_plugin: Any
    fsdp_plugin: Any
    dynamo_plugin: Any
    parallelism_config: Any
    gradient_state: _Record
    accelerator: weakref.ref[Any]


_latest: _Facts | None = None


@launched.forget_when_a_rank_starts
def _forget() -> None:
    """No Accelerator made here yet: a new rank (or accelerate's _reset_state) forgets the
    latest one, which a fork inherits from its caller."""
    global _latest
    _latest = None


def register(accelerator: Any) -> None:
    """Note ``accelerator`` as this process's latest (its constructor calls this)."""
    global _latest
    _latest = _Facts(
        state=accelerator.state,
        distributed_type=accelerator.distributed_type,
        mixed_precision=accelerator.mixed_precision,
        deepspeed_plugin=accelerator.deepspeed_plugin,
        fsdp_plugin=accelerator.fsdp_plugin,
        dynamo_plugin=accelerator.dynamo_plugin,
        parallelism_config=accelerator.parallelism_config,
        gradient_state=accelerator.gradient_state,
        accelerator=weakref.ref(accelerator),
    )


def is_initialized() -> bool:
    """Whether an ``Accelerator`` was made in this process.

    Example:
        >>> from notebook_accel.state import is_initialized
        >>> is_initialized()  # doctest: +SKIP
        False
    """
    return _latest is not None


class AcceleratorState(PartialState):
    """The latest Accelerator's facts, as accelerate's ``AcceleratorState()`` gives them.

    ``mixed_precision``, ``distributed_type``, ``num_processes``, ``device``,
    ``deepspeed_plugin``, ``fsdp_plugin`` (an ``FsdpConfig``), ``dynamo_plugin``,
    ``parallelism_config``, ``device_mesh``, and every :class:`PartialState` helper. The
    arguments are accelerate's and are not used: the Accelerator decided.

    Raises:
        ValueError: no Accelerator was made in this process yet (accelerate's refusal).

    Example:
        >>> from notebook_accel import Accelerator
        >>> from notebook_accel.state import AcceleratorState
        >>> accelerator = Accelerator(mixed_precision="bf16")  # doctest: +SKIP
        >>> AcceleratorState().mixed_precision  # doctest: +SKIP
        'bf16'
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        parallelism_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if _latest is None:
            raise ValueError(
                "Please make sure to properly initialize your accelerator via `accelerator = "
                "Accelerator()` before using AcceleratorState() (as accelerate requires)."
            )
        self._facts = _latest
        self._state = _latest.state

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``."""
        return self._facts.mixed_precision

    @property
    def distributed_type(self) -> DistributedType:
        """The Accelerator's: FSDP or DEEPSPEED under those strategies, as accelerate's."""
        return self._facts.distributed_type

    @property
    def deepspeed_plugin(self) -> Any:
        """The ``DeepSpeedPlugin`` in use, or None."""
        return self._facts.deepspeed_plugin

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP options in use (an ``FsdpConfig``), or None."""
        return self._facts.fsdp_plugin

    @property
    def dynamo_plugin(self) -> Any:
        """The ``TorchDynamoPlugin`` in use, or None."""
        return self._facts.dynamo_plugin

    @property
    def parallelism_config(self) -> Any:
        """The ``ParallelismConfig`` in use, or None."""
        return self._facts.parallelism_config

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` of the ``parallelism_config`` (None without one, or once the
        Accelerator is gone)."""
        accelerator = self._facts.accelerator()
        return None if accelerator is None else accelerator.torch_device_mesh

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the latest Accelerator (accelerate's test helper)."""
        _forget()

    def __repr__(self) -> str:
        return f"{super().__repr__()}\nMixed precision type: {self.mixed_precision}\n"


class GradientState:
    """accelerate's ``GradientState()``: the latest Accelerator's gradient state, read live.

    ``sync_gradients`` (does this micro-batch step?), ``num_steps`` (the accumulation steps),
    ``end_of_dataloader`` and ``remainder`` (the active prepared loader's last batch). Without
    an Accelerator, a fresh record (``num_steps`` from the plugin, else 1).
    ``adjust_scheduler`` and ``sync_with_dataloader`` answer as accelerate's do for the
    plugins it accepts (accelerate reads them from the plugin's non-default fields).

    Example:
        >>> from notebook_accel.state import GradientState
        >>> GradientState().sync_gradients
        True
    """

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None):
        if _latest is not None:
            self._record = _latest.gradient_state
        else:
            plugin = gradient_accumulation_plugin
            self._record = _Record(accumulation_steps=(plugin and plugin.num_steps) or 1)

    sync_gradients = property(lambda self: self._record.sync_gradients, doc="Steps now?")
    num_steps = property(lambda self: self._record.accumulation_steps, doc="Accumulation.")
    end_of_dataloader = property(
        lambda self: self._record.end_of_dataloader, doc="The loader's last batch."
    )
    remainder = property(lambda self: self._record.remainder, doc="Real samples of it, or -1.")
    adjust_scheduler = property(lambda self: False, doc="accelerate's answer (see above).")
    sync_with_dataloader = property(lambda self: True, doc="A loader's end ends a cycle.")
    initialized = property(lambda self: True, doc="True: a GradientState exists.")

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {{'num_steps': {self.num_steps}}}\n"
        )
