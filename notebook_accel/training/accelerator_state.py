"""accelerate's ``AcceleratorState`` and ``accelerate.state.is_initialized()``.

    Accelerator(...)   -> Facts (its ProcessState, precision name, plugins; a weak reference
                          for the mesh): its ``state`` (AcceleratorState.of(facts)), and
                          register(facts): this process's latest Accelerator's
    AcceleratorState() -> the latest facts; before any Accelerator, a ValueError, as
                          accelerate's
    is_initialized()   -> an Accelerator was made in this process
    GradientState()    -> the latest Accelerator's record (training/process.py)

accelerate keeps these in Borg dicts that every instance shares. Here the Accelerator stays
the owner of its facts: they are small and fixed, with a weak reference for the mesh, so the
Accelerator and its prepared models are freed as usual, while ``AcceleratorState()`` still
answers afterwards (as accelerate's does). Library code such as transformers' reads
``AcceleratorState().mixed_precision`` inside a user's function. A worker is a fresh process
for each launch, so nothing carries from one launch to the next.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from .. import launched
from .process import DistributedType, ProcessState
from .processes import PartialState

__all__ = ["AcceleratorState", "Facts", "is_initialized", "register"]


@dataclass(frozen=True)
class Facts:
    """What an Accelerator settled at construction: its process and its choices. Its
    ``state`` (an AcceleratorState) reads them, and so does ``AcceleratorState()`` after."""

    process: ProcessState
    distributed_type: DistributedType
    mixed_precision: str
    deepspeed_plugin: Any
    fsdp_plugin: Any
    dynamo_plugin: Any
    parallelism_config: Any
    accelerator: weakref.ref[Any]


_latest: Facts | None = None


@launched.forget_when_a_rank_starts
def _forget() -> None:
    """No Accelerator made here yet: a new rank (or accelerate's _reset_state) forgets the
    latest one, which a fork inherits from its caller."""
    global _latest
    _latest = None


def register(facts: Facts) -> None:
    """Note an Accelerator's facts as this process's latest (its constructor calls this)."""
    global _latest
    _latest = facts


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
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if _latest is None:
            raise ValueError(
                "Please make sure to properly initialize your accelerator via `accelerator = "
                "Accelerator()` before using AcceleratorState() (as accelerate requires)."
            )
        self._facts = _latest
        self._process = _latest.process

    @classmethod
    def of(cls, facts: Facts) -> AcceleratorState:
        """The state of the Accelerator these facts are of (``accelerator.state``)."""
        self = cls.__new__(cls)
        self._facts, self._process = facts, facts.process
        return self

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
