"""accelerate's ``AcceleratorState`` and ``accelerate.state.is_initialized()``.

    Accelerator(...)  -> register(accelerator): this process's latest Accelerator (weakly)
    AcceleratorState() -> its facts (process state, precision, plugins, mesh), or, with no
                          Accelerator alive, a PartialState's with the given precision
    GradientState()    -> its gradient state (sync_gradients, num_steps, ...), or a fresh one
    is_initialized()   -> an Accelerator (or an AcceleratorState) was made in this process

accelerate keeps these in a Borg dict that every instance shares. Here the Accelerator stays
the owner of its facts: an ``AcceleratorState`` reads the latest live one (library code such
as transformers' reads ``AcceleratorState().mixed_precision`` inside a user's function). The
one process-wide record is the two module variables below; a worker is a fresh process for
each launch, so nothing carries from one launch to the next.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import env
from .handlers import GradientAccumulationPlugin
from .precision import check_precision
from .processes import PartialState
from .state import GradientState as _Record

__all__ = ["AcceleratorState", "GradientState", "is_initialized", "register"]

_latest: weakref.ref[Any] | None = None
_initialized = False


def register(accelerator: Any) -> None:
    """Note ``accelerator`` as this process's latest (its constructor calls this)."""
    global _latest, _initialized
    _latest = weakref.ref(accelerator)
    _initialized = True


def is_initialized() -> bool:
    """Whether an ``Accelerator`` (or an ``AcceleratorState``) was made in this process.

    Example:
        >>> from notebook_accel.state import is_initialized
        >>> is_initialized()  # doctest: +SKIP
        False
    """
    return _initialized


def _live() -> Any:
    return _latest() if _latest is not None else None


class AcceleratorState(PartialState):
    """The Accelerator's facts, as accelerate's ``AcceleratorState()`` gives them anywhere.

    Inside a function that built an ``Accelerator``, ``AcceleratorState()`` reads that
    Accelerator's: ``mixed_precision``, ``distributed_type``, ``num_processes``, ``device``,
    ``deepspeed_plugin``, ``fsdp_plugin``, ``parallelism_config``, ``device_mesh``, and every
    :class:`PartialState` helper. Without one, it is a ``PartialState`` with the given
    ``mixed_precision`` (else the launch's), and ``is_initialized()`` is true from then on.

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
        global _initialized
        self._accelerator = _live()
        if self._accelerator is not None:
            self._state = self._accelerator.state
            return
        super().__init__(cpu=cpu, **kwargs)
        if mixed_precision is None:
            mixed_precision = env.launch_option("mixed_precision") or "no"
        self._facts = {
            "mixed_precision": check_precision(mixed_precision),
            "dynamo_plugin": dynamo_plugin,
            "deepspeed_plugin": deepspeed_plugin,
            "fsdp_plugin": fsdp_plugin,
            "parallelism_config": parallelism_config,
            "device_mesh": None,
        }
        _initialized = True

    def _fact(self, name: str, attribute: str) -> Any:
        if self._accelerator is not None:
            return getattr(self._accelerator, attribute)
        return self._facts[name]

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``."""
        return str(self._fact("mixed_precision", "mixed_precision"))

    @property
    def deepspeed_plugin(self) -> Any:
        """The ``DeepSpeedPlugin`` in use, or None."""
        return self._fact("deepspeed_plugin", "deepspeed_plugin")

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP options in use (an ``FsdpConfig``), or None."""
        return self._fact("fsdp_plugin", "fsdp_plugin")

    @property
    def dynamo_plugin(self) -> Any:
        """The ``TorchDynamoPlugin`` in use, or None."""
        return self._fact("dynamo_plugin", "dynamo_plugin")

    @property
    def parallelism_config(self) -> Any:
        """The ``ParallelismConfig`` in use, or None."""
        return self._fact("parallelism_config", "parallelism_config")

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` of the ``parallelism_config``, or None."""
        return self._fact("device_mesh", "torch_device_mesh")

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the latest Accelerator (accelerate's test helper)."""
        global _latest, _initialized
        _latest, _initialized = None, False

    def __repr__(self) -> str:
        return f"{super().__repr__()}\nMixed precision type: {self.mixed_precision}\n"


class GradientState:
    """accelerate's ``GradientState()``: the latest Accelerator's gradient state, read live.

    ``sync_gradients`` (does this micro-batch step?), ``num_steps`` (the accumulation steps),
    ``end_of_dataloader`` and ``remainder`` (the active prepared loader's last batch). Without
    an Accelerator alive, a fresh record (``num_steps`` from the plugin, else 1).
    ``adjust_scheduler`` and ``sync_with_dataloader`` answer as accelerate's do for the
    plugins it accepts (accelerate reads them from the plugin's non-default fields).

    Example:
        >>> from notebook_accel.state import GradientState
        >>> GradientState().sync_gradients
        True
    """

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None):
        accelerator = _live()
        if accelerator is not None:
            self._record: _Record = accelerator.gradient_state
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
