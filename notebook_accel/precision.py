"""Mixed precision as small objects behind one interface, and the optimizer/scheduler wrappers.

    Precision            autocast() -> nullcontext, backward = loss.backward(), step = opt.step()
      Bf16Precision      autocast(bfloat16); no scaling needed (bf16 has fp32's exponent range)
        Fp8Precision     (fp8.py) torchao float8 Linear layers + bf16 autocast; convert_model
      Fp16Precision      autocast(float16) + GradScaler: scaled backward, unscale once per step,
                         a step whose gradients overflowed is skipped and reported
      EngineFp16Precision  autocast(float16) only: an engine scales the loss (DeepSpeed)

The facade never branches on the precision's name: it asks the object.
"""

from __future__ import annotations

import contextlib
import weakref
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
    "EngineFp16Precision",
    "check_precision",
    "make_precision",
    "AutocastForward",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
]

MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]


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

    def wrap_forward(self, module: torch.nn.Module) -> None:
        """Make ``module`` run under autocast with float32 outputs (as accelerate does).

        The forward is an :class:`AutocastForward` bound to this module, so a deep copy or a
        pickle of the module carries its own autocast forward (never the original's).
        """
        if self.dtype is not None and not isinstance(
            module.__dict__.get("forward"), AutocastForward
        ):
            module.forward = AutocastForward(module, self.device_type, self.dtype)

    def track(self, optimizer: torch.optim.Optimizer) -> None:
        """Note a prepared optimizer (fp16 updates its scaler once all have stepped)."""

    def forget(self) -> None:
        """Forget the prepared optimizers (:meth:`Accelerator.free_memory`)."""

    def convert_model(self, model: torch.nn.Module, sharded: bool = False) -> torch.nn.Module:
        """Change the model's layers where the precision needs it (fp8); others keep it."""
        return model

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
    """float16 autocast with a GradScaler (CUDA, and CPU where torch supports it).

    GradScaler's recipe with several optimizers is ``step`` each, then one ``update()``:
    ``update()`` forgets which optimizers were already unscaled, so updating after the first
    optimizer's step made the second one unscale (divide by the scale) a second time. The
    update therefore runs once every prepared optimizer has stepped, or, when some do not step
    this iteration (alternating GAN updates), before the next backward pass at the latest.
    """

    name = "fp16"
    dtype = torch.float16

    def __init__(self, device_type: str, scaler_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(device_type)
        self.scaler = torch.amp.GradScaler(device_type, **(scaler_kwargs or {}))
        # GradScaler refuses a second unscale_ of one optimizer in one step; remember who was.
        self._unscaled: set[int] = set()
        self._stepped: set[int] = set()  # optimizers stepped since the last update()
        self._tracked: set[int] = set()  # the prepared optimizers (see track)

    def track(self, optimizer: torch.optim.Optimizer) -> None:
        """Count ``optimizer`` among those that step every iteration (see the class doc)."""
        self._tracked.add(id(optimizer))

    def forget(self) -> None:
        """Settle the pending update and forget the prepared optimizers (free_memory)."""
        self._settle()
        self._tracked.clear()

    def _settle(self) -> None:
        """Run the pending ``update()``: the steps of this iteration are over."""
        assert self.scaler is not None
        if self._stepped:
            self.scaler.update()
            self._stepped.clear()
            self._unscaled.clear()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        assert self.scaler is not None
        self._settle()
        self.scaler.scale(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.scaler is not None
        # Stepped since the last update: its gradients were unscaled by that step already.
        if id(optimizer) not in self._unscaled and id(optimizer) not in self._stepped:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        assert self.scaler is not None
        if id(optimizer) in self._stepped:  # a second step without a backward in between
            self._settle()
        ran: list[bool] = []
        # GradScaler calls optimizer.step() only when the gradients are finite: a post-hook
        # tells whether it did, without reading the scaler's private per-optimizer state.
        handle = optimizer.register_step_post_hook(lambda *_: ran.append(True))
        try:
            self.scaler.step(optimizer)
        finally:
            handle.remove()
        self._stepped.add(id(optimizer))
        if self._tracked <= self._stepped:
            self._settle()
        return bool(ran)

    def state_dict(self) -> dict[str, Any]:
        assert self.scaler is not None
        self._settle()
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


class EngineFp16Precision(Precision):
    """float16 autocast without a GradScaler: the training engine scales the loss itself
    (DeepSpeed's ``fp16`` config: dynamic loss scale, overflowed steps skipped)."""

    name = "fp16"
    dtype = torch.float16


_PRECISIONS: dict[str, type[Precision]] = {
    "no": Precision,
    "fp16": Fp16Precision,
    "bf16": Bf16Precision,
}


def check_precision(name: object) -> str:
    """Return ``name`` if it is an accepted precision, else raise :class:`ConfigError`."""
    if name not in _PRECISIONS and name != "fp8":
        accepted = "one of " + ", ".join(repr(v) for v in get_args(MixedPrecision))
        raise ConfigError("mixed_precision", name, accepted)
    return str(name)


def make_precision(
    name: object,
    device_type: str,
    scaler_kwargs: dict[str, Any] | None = None,
    recipe: Any = None,
    device: Any = None,
    loss_scaler: bool = True,
) -> Precision:
    """The precision object for ``name`` (``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``).

    ``recipe`` is fp8's :class:`~notebook_accel.fp8.AORecipeKwargs` (or ``None``) and
    ``device`` the process's device, whose float8 support fp8 checks.

    ``scaler_kwargs`` go to fp16's ``torch.amp.GradScaler`` (``GradScalerKwargs``);
    ``loss_scaler=False``: fp16 without one (an engine such as DeepSpeed scales the loss).

    Raises:
        ConfigError: ``name`` is not one of the accepted values.

    Example:
        >>> make_precision("bf16", "cpu").dtype
        torch.bfloat16
    """
    name = check_precision(name)
    if recipe is not None and name != "fp8":  # as accelerate: fp8 options without fp8
        raise ConfigError(
            "mixed_precision", name, "'fp8' when kwargs_handlers holds an AORecipeKwargs"
        )
    if device_type == "xla":
        if name in ("fp16", "fp8"):
            raise ConfigError(
                "mixed_precision", name, "'no' or 'bf16' on TPU (XLA)", "TPUs compute in bf16."
            )
        return XlaPrecision(device_type, name)
    if name == "fp16":
        if not loss_scaler:
            return EngineFp16Precision(device_type)
        return Fp16Precision(device_type, scaler_kwargs)
    if name == "fp8":
        from .fp8 import Fp8Precision  # imports torchao when used: only for fp8

        return Fp8Precision(device_type, recipe, device)
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


class AutocastForward:
    """A module's forward under autocast, returning float32: stored as ``module.forward``.

    It refers to its module and looks the module's own forward up at call time, instead of
    closing over a bound method: ``copy.deepcopy`` of the module gives the copy a wrapper that
    runs the copy (an EMA model with its own weights), and ``pickle``/``torch.save`` of the
    module work, since this class is importable and holds no closure. The reference is weak,
    so the module and its wrapper form no cycle: dropping the last reference to a model frees
    its (device) memory at once, without waiting for the garbage collector.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> model.forward = AutocastForward(model, "cpu", torch.bfloat16)
        >>> model(torch.ones(1, 2)).dtype
        torch.float32
    """

    def __init__(self, module: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
        self._module = weakref.ref(module)
        self.device_type = device_type
        self.dtype = dtype
        # A forward the user had set on the instance (rare) is kept and run; else the class's.
        self.inner = module.__dict__.get("forward")

    @property
    def module(self) -> torch.nn.Module:
        """The module this forward belongs to."""
        module = self._module()
        if module is None:
            raise ReferenceError("the module of this autocast forward no longer exists")
        return module

    def __getstate__(self) -> dict[str, Any]:
        # deepcopy and pickle see the module itself: a copy of the module (found in their
        # memo) gets a wrapper of its own.
        return {
            "module": self.module,
            "device_type": self.device_type,
            "dtype": self.dtype,
            "inner": self.inner,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._module = weakref.ref(state["module"])
        self.device_type = state["device_type"]
        self.dtype = state["dtype"]
        self.inner = state["inner"]

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # inspect.signature() follows this: the wrapper shows the model's own signature.
        if self.inner is not None:
            return self.inner
        module = self.module
        return type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            out = self.__wrapped__(*args, **kwargs)
        return _to_float32(out, self.dtype)

    @staticmethod
    def remove(module: torch.nn.Module) -> None:
        """Give ``module`` back its forward without autocast (no-op if it has none)."""
        wrapper = module.__dict__.get("forward")
        if isinstance(wrapper, AutocastForward):
            if wrapper.inner is None:
                del module.forward
            else:
                module.forward = wrapper.inner


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
        precision.track(optimizer)

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
    """An LR scheduler that steps with its optimizer(s), as accelerate's does.

    On a step where the optimizer really stepped, the schedule advances ``num_processes``
    times when each process has its own batches (the global batch is ``num_processes`` times
    the loader's, so a schedule sized from the unprepared loader ends on time) and once with
    ``split_batches``. Nothing happens mid-accumulation or when fp16 skipped the step. With
    ``step_with_optimizer=False`` each call steps the schedule once, unconditionally.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        num_processes: int = 1,
        split_batches: bool = False,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradients = optimizers[0].gradients if optimizers else GradientState()
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule for one optimizer step (see the class docstring)."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradients.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        for _ in range(1 if self.split_batches else self.num_processes):
            total = getattr(self.scheduler, "total_steps", None)
            # OneCycleLR raises past its total_steps; a short last epoch can get there.
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates of the last step."""
        return list(self.scheduler.get_last_lr())

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "scheduler" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["scheduler"], name)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
