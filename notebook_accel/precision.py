"""Mixed precision as small objects behind one interface, and the optimizer/scheduler wrappers.

    Precision            autocast() -> nullcontext, backward = loss.backward(), step = opt.step()
      Bf16Precision      autocast(bfloat16); no scaling needed (bf16 has fp32's exponent range)
      Fp16Precision      autocast(float16) + GradScaler: scaled backward, unscale once per step,
                         a step whose gradients overflowed is skipped and reported

The facade never branches on the precision's name: it asks the object.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import torch

from .errors import ConfigError
from .state import GradientState

__all__ = [
    "MixedPrecision",
    "Precision",
    "Bf16Precision",
    "Fp16Precision",
    "check_precision",
    "make_precision",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
]

MixedPrecision = Literal["no", "fp16", "bf16"]


class Precision:
    """Full precision; the base class every precision shares.

    Example:
        >>> p = make_precision("no", "cpu")
        >>> with p.autocast():
        ...     pass
    """

    name: str = "no"
    dtype: torch.dtype | None = None

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The context a forward pass runs in."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            yield

    def wrap_forward(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """Run ``forward`` under autocast and hand back float32 outputs (as accelerate does)."""
        low = self.dtype
        if low is None:
            return forward

        @functools.wraps(forward)
        def autocast_forward(*args: Any, **kwargs: Any) -> Any:
            with self.autocast():
                out = forward(*args, **kwargs)
            return _to_float32(out, low)

        return autocast_forward

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (scaled where the precision needs it)."""
        loss.backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true values before clipping (no-op without scaling)."""

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer``; return False when the step was skipped."""
        optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep (the scaler's state for fp16)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class Bf16Precision(Precision):
    """bfloat16 autocast; no loss scaling."""

    name = "bf16"
    dtype = torch.bfloat16


class Fp16Precision(Precision):
    """float16 autocast with a GradScaler (CUDA, and CPU where torch supports it)."""

    name = "fp16"
    dtype = torch.float16

    def __init__(self, device_type: str) -> None:
        super().__init__(device_type)
        self.scaler = torch.amp.GradScaler(device_type)
        # GradScaler refuses a second unscale_ of one optimizer in one step; remember who was.
        self._unscaled: set[int] = set()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        assert self.scaler is not None
        self.scaler.scale(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.scaler is not None
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        assert self.scaler is not None
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        # update() lowers the scale exactly when it found inf/nan and skipped the step.
        return self.scaler.get_scale() >= before

    def state_dict(self) -> dict[str, Any]:
        assert self.scaler is not None
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.scaler is not None
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


class XlaPrecision(Precision):
    """An XLA device (TPU): full precision or bf16, and each step ends the lazy graph.

    torch_xla records operations lazily; without a cut after the optimizer step the graph
    grows across steps until something reads a value. TPUs have no fp16 path worth having
    (bf16 is native and needs no scaler), so fp16 is refused up front.
    """

    def __init__(self, device_type: str, name: str) -> None:
        super().__init__(device_type)
        self.name = name
        self.dtype = torch.bfloat16 if name == "bf16" else None

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        if xr.addressable_device_count() > 1 and xr.world_size() > 1:
            # Devices driven by threads of one process have no DDP (state.py): average the
            # gradients across devices here, as torch_xla's own optimizer_step does.
            xm.reduce_gradients(optimizer)
        optimizer.step()
        torch_xla.sync()
        return True


_PRECISIONS: dict[str, type[Precision]] = {
    "no": Precision,
    "fp16": Fp16Precision,
    "bf16": Bf16Precision,
}


def check_precision(name: object) -> str:
    """Return ``name`` if it is an accepted precision, else raise :class:`ConfigError`."""
    if name not in _PRECISIONS:
        accepted = "one of " + ", ".join(repr(v) for v in get_args(MixedPrecision))
        raise ConfigError("mixed_precision", name, accepted)
    return str(name)


def make_precision(name: object, device_type: str) -> Precision:
    """The precision object for ``name`` (``"no"``, ``"fp16"`` or ``"bf16"``).

    Raises:
        ConfigError: ``name`` is not one of the accepted values.

    Example:
        >>> make_precision("bf16", "cpu").dtype
        torch.bfloat16
    """
    name = check_precision(name)
    if device_type == "xla":
        if name == "fp16":
            raise ConfigError(
                "mixed_precision", name, "'no' or 'bf16' on TPU (XLA)", "TPUs compute in bf16."
            )
        return XlaPrecision(device_type, name)
    return _PRECISIONS[name](device_type)


def _to_float32(data: Any, low: torch.dtype) -> Any:
    if isinstance(data, torch.Tensor):
        return data.float() if data.dtype == low else data
    if isinstance(data, dict):
        return type(data)({k: _to_float32(v, low) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_to_float32(v, low) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(_to_float32(v, low) for v in data)
    return data


class AcceleratedOptimizer(torch.optim.Optimizer):
    """An optimizer that steps and zeroes only on synchronising steps, through the precision.

    Attribute access falls through to the wrapped optimizer, so ``param_groups``, ``state``
    and ``state_dict()`` behave as the user's optimizer does.

    Example:
        >>> opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))  # doctest: +SKIP
        >>> opt.step_was_skipped  # doctest: +SKIP
        False
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, precision: Precision, gradients: GradientState
    ) -> None:
        # Deliberately no super().__init__: this object is a view over ``optimizer``.
        self.optimizer = optimizer
        self.precision = precision
        self.gradients = gradients
        self.step_was_skipped = False

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Step on synchronising steps only; records ``step_was_skipped`` (fp16 overflow)."""
        if not self.gradients.sync_gradients:
            return
        self.step_was_skipped = not self.precision.step(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients, except in the middle of an accumulation cycle."""
        if self.gradients.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """An LR scheduler that steps only when its optimizer(s) really stepped.

    One optimizer step gives one scheduler step, whatever the number of processes.
    """

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer]) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradients = optimizers[0].gradients if optimizers else GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the schedule unless this was an accumulation step or a skipped fp16 step."""
        if not self.gradients.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "scheduler" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["scheduler"], name)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
