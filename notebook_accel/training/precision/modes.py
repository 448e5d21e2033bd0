"""Mixed precision as small objects behind one interface (``make_precision`` picks one).

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
from typing import Any

import torch

from ...config import MixedPrecision

__all__ = [
    "MixedPrecision",
    "Precision",
    "Bf16Precision",
    "Fp16Precision",
    "EngineFp16Precision",
    "AutocastForward",
]


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
        # Whether torch's autocast runs the mixed precision (accelerate's native_amp): not
        # where an engine keeps its own half-precision weights (make_precision says so).
        self.native_amp = self.dtype is not None

    @contextlib.contextmanager
    def autocast(self, **options: Any) -> Iterator[None]:
        """The context a forward pass runs in; ``options`` go to ``torch.autocast``
        (``AutocastKwargs``: ``enabled``, ``cache_enabled``)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.dtype, **options):
            yield

    def wrap_forward(self, module: torch.nn.Module, **options: Any) -> None:
        """Make ``module`` run under autocast with float32 outputs (as accelerate does);
        ``options`` go to ``torch.autocast`` (the Accelerator's ``AutocastKwargs``).

        The forward is an :class:`AutocastForward` bound to this module, so a deep copy or a
        pickle of the module carries its own autocast forward (never the original's).
        """
        if self.dtype is not None and not isinstance(
            module.__dict__.get("forward"), AutocastForward
        ):
            module.forward = AutocastForward(module, self.device_type, self.dtype, options)

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
        self.name = name
        self.dtype = torch.bfloat16 if name == "bf16" else None
        super().__init__(device_type)

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

    def __init__(self, device_type: str) -> None:
        super().__init__(device_type)
        self.native_amp = False  # the engine keeps its own fp16 weights


_PRECISIONS: dict[str, type[Precision]] = {
    "no": Precision,
    "fp16": Fp16Precision,
    "bf16": Bf16Precision,
}


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

    def __init__(
        self,
        module: torch.nn.Module,
        device_type: str,
        dtype: torch.dtype,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._module = weakref.ref(module)
        self.device_type = device_type
        self.dtype = dtype
        self.options = dict(options or {})  # torch.autocast's enabled / cache_enabled
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
            "options": self.options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._module = weakref.ref(state["module"])
        self.device_type = state["device_type"]
        self.dtype = state["dtype"]
        self.inner = state["inner"]
        self.options = state.get("options", {})  # pickles from before the options

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # inspect.signature() follows this: the wrapper shows the model's own signature.
        if self.inner is not None:
            return self.inner
        module = self.module
        return type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype, **self.options):
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
