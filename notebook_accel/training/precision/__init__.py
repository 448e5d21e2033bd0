"""Mixed precision: ``make_precision`` picks the object for a ``mixed_precision`` name.

modes.py     Precision (no), Bf16Precision, Fp16Precision (GradScaler), XlaPrecision,
             EngineFp16Precision (an engine scales the loss)
fp8.py       Fp8Precision: torchao float8 Linear layers + bf16 autocast (imported for fp8)
wrappers.py  AutocastForward (a prepared model's forward), the optimizer and scheduler
             wrappers that step through the precision
"""

from __future__ import annotations

from typing import Any, get_args

from ...errors import ConfigError
from ...options import rules
from .modes import (
    _PRECISIONS,
    EngineFp16Precision,
    Fp16Precision,
    MixedPrecision,
    Precision,
    XlaPrecision,
)

__all__ = ["check_precision", "make_precision"]


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

    ``recipe`` is fp8's :class:`~notebook_accel.AORecipeKwargs` (or ``None``) and
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
        rules.precision_on(name, ("no", "bf16"), "TPU (XLA)", "TPUs compute in bf16.")
        return XlaPrecision(device_type, name)
    if device_type == "tpu":
        # TorchTPU has no _amp_foreach_non_finite_check_and_unscale_: no GradScaler, so no
        # fp16 (accelerate 1.16 refuses it too); its bf16 is torch's autocast on "tpu".
        rules.precision_on(name, ("no", "bf16"), "TPU (TorchTPU)", "TPUs compute in bf16.")
    if name == "fp16":
        if not loss_scaler:
            return EngineFp16Precision(device_type)
        return Fp16Precision(device_type, scaler_kwargs)
    if name == "fp8":
        from .fp8 import Fp8Precision  # imports torchao when used: only for fp8

        return Fp8Precision(device_type, recipe, device)
    precision = _PRECISIONS[name](device_type)
    precision.native_amp = precision.native_amp and loss_scaler  # an engine's bf16 weights
    return precision
