"""fp8 training through torchao's float8 linear layers, behind the Precision interface.

    Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(...)])
      -> Fp8Precision(device, recipe)        checks the hardware at construction:
                                             CUDA with compute capability >= 8.9, or the
                                             caller asked for torchao's emulation
      -> prepare(model): convert_model()     nn.Linear -> torchao Float8Linear, except the
                                             first and the last Linear and any whose
                                             dimensions are not multiples of 16
      -> forward under bf16 autocast         as accelerate does for fp8 (matmuls in float8,
                                             the rest in bf16); no loss scaling
      -> step(): with FSDP gathering weights in float8, their scales are precomputed

torch and torchao are imported only when fp8 is used; ``AORecipeKwargs`` itself can be built
without torchao (its default config is made when the precision needs it).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from ...errors import ConfigError
from ...quiet import quiet_torchao
from ..handlers import KwargsHandler
from .modes import Bf16Precision

# Before torchao is first imported, by this module's functions or by the user's code.
quiet_torchao()

__all__ = [
    "AORecipeKwargs",
    "FP8BackendType",
    "Fp8Precision",
    "MIN_CAPABILITY",
    "first_and_last_linear_filter",
]


class FP8BackendType(str, enum.Enum):  # noqa: UP042 - accelerate's kind of enum
    """accelerate's fp8 backends: ``AO`` (torchao, the one here), ``TE`` (NVIDIA Transformer
    Engine, refused), ``NO``; ``Accelerator.fp8_backend`` answers with one."""

    NO = "NO"
    TE = "TE"
    AO = "AO"


# float8 tensor cores (torch._scaled_mm) exist from Ada (8.9) and Hopper (9.0) on.
MIN_CAPABILITY = (8, 9)
INSTALL_HINT = "Install torchao: pip install 'notebook_accel[fp8]'."


@dataclasses.dataclass
class AORecipeKwargs(KwargsHandler):
    """Options of fp8 training through torchao (accelerate's name and fields).

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; by default one with
            ``pad_inner_dim`` and ``enable_fsdp_float8_all_gather`` as below.
            ``Float8LinearConfig(emulate=True)`` runs the float8 casts without float8 tensor
            cores (any device, CPU included): slow, for tests and for trying the path out.
        module_filter_func: ``(module, fully_qualified_name) -> bool``, which ``nn.Linear``
            layers to convert; by default every one except the first and the last, and
            those whose dimensions are not multiples of 16 (see
            :func:`first_and_last_linear_filter`).
        pad_inner_dim: for the default config: pad matmul dimensions to multiples of 16.
        enable_fsdp_float8_all_gather: for the default config: FSDP2 gathers parameters in
            float8. ``None`` means "when the model is sharded with FSDP"; accelerate turns it
            on always, which changes the weights' tensor type under DDP for no gain.

    Example:
        >>> from torchao.float8 import Float8LinearConfig  # doctest: +SKIP
        >>> acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[
        ...     AORecipeKwargs(config=Float8LinearConfig(emulate=True))])  # doctest: +SKIP
    """

    config: Any = None
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def float8_config(self, sharded: bool) -> Any:
        """The ``Float8LinearConfig`` to convert with (the given one, or the default)."""
        if self.config is not None:
            return self.config
        from torchao.float8 import Float8LinearConfig

        gather = self.enable_fsdp_float8_all_gather
        return Float8LinearConfig(
            pad_inner_dim=True if self.pad_inner_dim is None else self.pad_inner_dim,
            enable_fsdp_float8_all_gather=sharded if gather is None else gather,
        )

    @property
    def emulated(self) -> bool:
        """Whether the caller asked for torchao's emulation (no float8 hardware needed)."""
        return bool(getattr(self.config, "emulate", False))


def first_and_last_linear_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """The default layer filter for ``model``: convert the inner Linear layers only.

    torchao's and accelerate's advice: the first and the last Linear stay in high precision
    (converting them hurts convergence), and float8 matmuls need both dimensions to be
    multiples of 16.
    """
    linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    edges = {linears[0], linears[-1]} if linears else set()

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return True  # containers: let torchao walk into them
        if module.in_features % 16 or module.out_features % 16:
            return False
        return fqn not in edges

    return keep


def _check_hardware(device: torch.device, recipe: AORecipeKwargs) -> None:
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("mixed_precision", "fp8", "torchao installed for fp8", INSTALL_HINT)
    if recipe.emulated:
        return
    where = "this process uses the CPU"
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability >= MIN_CAPABILITY:
            return
        name = torch.cuda.get_device_name(device)
        where = f"{name} has compute capability {capability[0]}.{capability[1]}"
    elif device.type != "cpu":
        where = f"this process uses {device.type}"
    raise ConfigError(
        "mixed_precision",
        "fp8",
        f"'fp8' on a CUDA GPU with compute capability >= 8.9 (Ada, Hopper or newer); {where}",
        "Use 'bf16', or ask for torchao's emulation explicitly: kwargs_handlers="
        "[AORecipeKwargs(config=Float8LinearConfig(emulate=True))] (slow; for trying it out).",
    )


class Fp8Precision(Bf16Precision):
    """fp8 matmuls in the converted Linear layers, bf16 autocast around them (as accelerate).

    Raises:
        ConfigError: at construction, when the device has no float8 tensor cores and the
            recipe does not ask for emulation, or when torchao is missing.
    """

    name = "fp8"

    def __init__(
        self, device_type: str, recipe: AORecipeKwargs | None = None, device: Any = None
    ) -> None:
        super().__init__(device_type)
        self.recipe = recipe or AORecipeKwargs()
        _check_hardware(torch.device(device or device_type), self.recipe)
        # FSDP models that gather their weights in float8: their scales are computed for all
        # weights in one all-reduce after each optimizer step (torchao's advice, as accelerate).
        self._gathered_in_float8: list[torch.nn.Module] = []

    def forget(self) -> None:
        """Let go of the FSDP models too (:meth:`Accelerator.free_memory`)."""
        super().forget()
        self._gathered_in_float8.clear()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        stepped = super().step(optimizer)
        if self._gathered_in_float8:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            for model in self._gathered_in_float8:
                precompute_float8_dynamic_scale_for_fsdp(model)
        return stepped

    def convert_model(self, model: torch.nn.Module, sharded: bool = False) -> torch.nn.Module:
        """Swap the chosen ``nn.Linear`` layers for torchao's ``Float8Linear`` (in place)."""
        from torchao.float8 import convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear

        if any(isinstance(m, Float8Linear) for m in model.modules()):
            return model  # prepared twice: already converted
        keep = self.recipe.module_filter_func or first_and_last_linear_filter(model)
        config = self.recipe.float8_config(sharded)
        converted = convert_to_float8_training(model, config=config, module_filter_fn=keep)
        if sharded and config.enable_fsdp_float8_all_gather:
            self._gathered_in_float8.append(converted)  # sharded in place right after this
        return converted
