"""Hooks around a module's forward: move inputs and weights where the forward runs.

    module.forward(*args)  ->  hook.pre_forward   (inputs to the execution device; lent
                                                   weights read from their map onto it)
                           ->  the original forward
                           ->  hook.post_forward  (lent weights back to the meta device;
                                                   the output to the input's device)

``add_hook_to_module`` keeps the original forward as ``module._old_forward`` and the hook
as ``module._hf_hook`` (accelerate's names, which transformers looks for);
``remove_hook_from_module`` puts the forward back and the weights where they were.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from notebook_accel.big_model.moves import find_device, send_to_device
from notebook_accel.big_model.tensors import named_module_tensors, set_module_tensor_to_device
from notebook_accel.devices import normalize_device

if TYPE_CHECKING:
    import torch
    from torch import nn


class ModelHook:
    """What runs around a module's forward; the base does nothing.

    Example:
        >>> class Double(ModelHook):
        ...     def post_forward(self, module, output):
        ...         return output * 2
        >>> add_hook_to_module(layer, Double())  # doctest: +SKIP
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        return module


class SequentialHook(ModelHook):
    """Several hooks in order (post_forward in the same order, as accelerate).

    Example:
        >>> add_hook_to_module(layer, SequentialHook(first, second))  # doctest: +SKIP
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    import torch

    hook: ModelHook = module._hf_hook  # type: ignore[assignment]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    else:
        output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Wrap ``module``'s forward with ``hook`` (replacing its hook, or after it: ``append``).

    Example:
        >>> add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu"))  # doctest: +SKIP
    """
    old = getattr(module, "_hf_hook", None)
    if append and old is not None:
        remove_hook_from_module(module)
        hook = SequentialHook(old, hook)
    if "_old_forward" not in module.__dict__:
        setattr(module, "_old_forward", module.forward)  # noqa: B010 (mypy: not a tensor)
    module = hook.init_hook(module)
    setattr(module, "_hf_hook", hook)  # noqa: B010
    wrapped = functools.partial(_hooked_forward, module)
    module.forward = functools.update_wrapper(wrapped, module._old_forward)  # type: ignore[arg-type]
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Put back the forward ``add_hook_to_module`` wrapped (and every child's: ``recurse``).

    The hook's ``detach_hook`` runs first: an offloading hook puts the weights back.

    Example:
        >>> remove_hook_from_module(model, recurse=True)  # doctest: +SKIP
    """
    hook = module.__dict__.pop("_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
    old = module.__dict__.pop("_old_forward", None)
    if old is not None:
        module.forward = old
    module.__dict__.pop("to", None)  # dispatch_model's guard
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Take the hooks off every submodule of ``module`` (not off ``module`` itself).

    Example:
        >>> remove_hook_from_submodules(model)  # doctest: +SKIP
    """
    for child in module.children():
        remove_hook_from_module(child, recurse=True)


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``; with ``offload``, lend it its weights per call.

    Args:
        execution_device: where the inputs and weights go for the forward pass.
        offload: keep the module's weights on the meta device between calls, read from
            ``weights_map`` (default: a CPU copy of them) for each forward.
        io_same_device: move the output back to the device the input came from.
        weights_map: name -> tensor, for the offloaded weights.
        offload_buffers: lend the buffers too (else they live on the execution device).
        place_submodules: the submodules' tensors too, not only the module's own.
        skip_keys: keyword inputs left where they are.
        tied_params_map: accelerate's record of tied weights lent on a device
            (``{data_ptr of the offloaded tensor: {device: tensor}}``), shared by the hooks
            of one model: a tied weight is lent once per forward and dropped after it.

    Example:
        >>> hook = AlignDevicesHook(execution_device="cpu", offload=True)
        >>> add_hook_to_module(layer, hook)  # doctest: +SKIP
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    ) -> None:
        self.execution_device = execution_device
        self.tied_params_map = tied_params_map
        self._tied_lent: list[tuple[int, Any]] = []
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device: Any = None
        self.original_devices: dict[str, torch.device] = {}

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _lent(self, module: nn.Module) -> list[str]:
        tensors = named_module_tensors(
            module, self.offload_buffers, self.place_submodules, remove_non_persistent=True
        )
        return [name for name, _ in tensors]

    def init_hook(self, module: nn.Module) -> nn.Module:
        device = self.execution_device
        if not self.offload:
            if device is not None:
                for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, device)
            return module
        tensors = dict(named_module_tensors(module, recurse=self.place_submodules))
        self.original_devices = {name: tensor.device for name, tensor in tensors.items()}
        lent = self._lent(module)
        if self.weights_map is None:
            self.weights_map = {name: tensors[name].to("cpu") for name in lent}
        for name in lent:
            set_module_tensor_to_device(module, name, "meta")
        if device is not None:
            for name in set(tensors) - set(lent):  # buffers not lent live where it runs
                if name not in dict(module.named_parameters(recurse=self.place_submodules)):
                    set_module_tensor_to_device(module, name, device)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        device = self.execution_device
        if self.offload and self.weights_map is not None:
            device = normalize_device(device if device is not None else "cpu")
            tied, lent = self.tied_params_map, []
            for name in self._lent(module):
                value = self.weights_map[name]
                record = None if tied is None else tied.get(value.data_ptr())
                if record is not None and device not in record:
                    lent.append((value.data_ptr(), device))
                set_module_tensor_to_device(module, name, device, value=value, tied_params_map=tied)
            self._tied_lent = lent
        if device is None:
            return args, kwargs
        return send_to_device(args, device), send_to_device(
            kwargs, device, skip_keys=self.skip_keys
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self._lent(module):
                set_module_tensor_to_device(module, name, "meta")
            # the tied weights this forward lent go too, so that their memory is freed
            for pointer, device in self._tied_lent:
                self.tied_params_map[pointer].pop(device, None)  # type: ignore[index]
            self._tied_lent = []
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload and self.weights_map is not None:
            for name, device in self.original_devices.items():
                if device.type != "meta" and name in self.weights_map:
                    value = self.weights_map[name]
                    set_module_tensor_to_device(module, name, device, value=value)
        return module


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU until its forward; then move it to the execution device.

    It stays there until ``init_hook`` (``UserCpuOffloadHook.offload``) runs again; the
    previous model of a pipeline (``prev_module_hook``) is offloaded first.

    Example:
        >>> add_hook_to_module(model, CpuOffload("cuda:0"))  # doctest: +SKIP
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.execution_device = execution_device if execution_device is not None else default()
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        import torch

        previous = self.prev_module_hook
        if previous is not None and next(previous.model.parameters()).device.type != "cpu":
            previous.offload()
        target = torch.device(self.execution_device)
        if next(module.parameters()).device != target:
            module.to(target)
        return send_to_device(args, target), send_to_device(kwargs, target)


class UserCpuOffloadHook:
    """A model and its ``CpuOffload`` hook: ``offload()`` sends it back to the CPU.

    Example:
        >>> model, hook = cpu_offload_with_hook(model)  # doctest: +SKIP
        >>> hook.offload()  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def default() -> torch.device:
    """Where a model runs by default: the first GPU, MPS, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
