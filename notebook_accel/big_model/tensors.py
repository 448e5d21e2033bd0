"""One tensor of a module set on a device, and what the device maps count: sizes and ties.

``param.to(device)`` makes a new tensor the module does not hold; these functions replace
the module's own entry (``_parameters`` or ``_buffers``), which is how a meta model gets its
weights and how an offloaded block lends and takes back its weights around a forward pass.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from notebook_accel import devices, refusals
from notebook_accel.errors import ConfigError
from notebook_accel.private import torch as private_torch

if TYPE_CHECKING:
    import torch
    from torch import nn

_UNITS = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in a size written as ``"5GB"``, ``"1.5GiB"`` or an int (``"8Gb"``: bits).

    Example:
        >>> convert_file_size_to_int("1MiB")
        1048576
    """
    if isinstance(size, int) and size >= 0:
        return size
    if isinstance(size, str):
        for unit, factor in _UNITS.items():
            if size.upper().endswith(unit):
                try:
                    number = int(float(size[: -len(unit)]) * factor)
                except ValueError:
                    break
                bits = unit.endswith("B") and not unit.endswith("IB") and size.endswith("b")
                return number // 8 if bits else number
    raise ConfigError("size", size, "bytes as an int, or a string with a unit like '5GB'")


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes one element of ``dtype`` takes (``bool``: 1/8, as accelerate counts it).

    Example:
        >>> import torch
        >>> dtype_byte_size(torch.float16)
        2
    """
    import torch

    if dtype == torch.bool:
        return 1 / 8
    if dtype.is_floating_point and "float8" in str(dtype):
        return 1
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ConfigError("dtype", dtype, "a torch dtype with a bit width (float16, int8, ...)")
    return int(bits.group(1)) // 8


def as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float16"``, ``"torch.float16"`` or a dtype as a ``torch.dtype``."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise ConfigError("dtype", dtype, "a torch dtype or its name ('float16', 'bfloat16')")
    return found


def keeps_dtype(tensor: torch.Tensor) -> bool:
    """Integer and boolean tensors keep their dtype when a model is cast."""
    return str(tensor.dtype).startswith(("torch.uint", "torch.int", "torch.bool"))


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """A module's parameters, then its buffers (without the non-persistent ones if asked).

    Example:
        >>> import torch.nn as nn
        >>> [name for name, _ in named_module_tensors(nn.BatchNorm1d(2))]
        ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        modules = module.named_modules() if recurse else iter([("", module)])
        for _, sub in modules:
            skipped |= private_torch.non_persistent_buffers(sub)
    for name, buffer in module.named_buffers(recurse=recurse):
        if name.rsplit(".", 1)[-1] not in skipped:
            yield name, buffer


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    *path, leaf = tensor_name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, leaf


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put one parameter or buffer of ``module`` on ``device``, with ``value`` if given.

    The module's own entry is replaced (a parameter stays a parameter of its class, with its
    ``requires_grad``). ``value`` is cast to the old tensor's dtype, or to ``dtype`` when
    given (integer and boolean values keep theirs); a meta tensor needs a ``value`` to go
    anywhere but the meta device.

    Args:
        module, tensor_name, device, value, dtype: as above (an int ``device`` is an
            accelerator index: ``normalize_device``).
        fp16_statistics: bitsandbytes' 8-bit statistics; refused (no bitsandbytes here).
        tied_params_map: accelerate's record of tied weights already on a device:
            ``{data_ptr of the source tensor: {device: the tensor there}}``. A tensor whose
            source is listed with ``device`` reuses that tensor (no second copy); one whose
            source is listed without it is recorded once placed.
        non_blocking: copy asynchronously where the device allows it.
        clear_cache: empty the device's cache after placing on an accelerator.

    Example:
        >>> import torch, torch.nn as nn
        >>> from notebook_accel.big_modeling import init_empty_weights
        >>> with init_empty_weights():
        ...     layer = nn.Linear(2, 2)
        >>> set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(2, 2))
    """
    import torch

    refusals.refuse_given("set_module_tensor_to_device", fp16_statistics=fp16_statistics)
    device = devices.normalize_device(device)
    owner, leaf = _owner(module, tensor_name)
    if not private_torch.has_tensor(owner, leaf):
        raise ConfigError(
            "tensor_name", tensor_name, f"a parameter or buffer of {type(owner).__name__}"
        )
    old = getattr(owner, leaf)
    sources = [t for t in (value, old) if t is not None]
    there = _tied_on(tied_params_map, sources, device)
    if there is not None:  # a weight tied to this one is on that device already: share it
        _store(owner, leaf, old, there)
        return
    target = torch.device(device) if not isinstance(device, torch.device) else device
    cast = as_dtype(dtype)
    if value is None and old.device.type == "meta" and target.type != "meta":
        raise ConfigError("value", None, f"a tensor: {tensor_name} is on the meta device")
    with torch.no_grad():
        if value is not None:
            if value.shape != old.shape:
                raise ConfigError("value", tuple(value.shape), f"a tensor of shape {old.shape}")
            if cast is None:
                value = value.to(old.dtype)
            elif not keeps_dtype(value):
                value = value.to(cast)
            new = value.to(target, non_blocking=non_blocking)
        else:
            new = old.to(target, non_blocking=non_blocking)
            if cast is not None and target.type == "meta" and not keeps_dtype(old):
                new = new.to(cast)
        placed = _store(owner, leaf, old, new)
    if clear_cache and target.type not in ("cpu", "meta"):
        devices.empty_cache()
    for source in sources if tied_params_map is not None else ():
        record = tied_params_map.get(source.data_ptr())  # type: ignore[union-attr]
        if record is not None and device not in record:
            record[device] = placed
            break


def _tied_on(
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None,
    sources: list[torch.Tensor],
    device: Any,
) -> torch.Tensor | None:
    """The tensor the map holds on ``device`` for one of ``sources`` (value first), if any."""
    for source in sources if tied_params_map is not None else ():
        there = tied_params_map.get(source.data_ptr(), {}).get(device)  # type: ignore[union-attr]
        if there is not None:
            return there
    return None


def _store(owner: nn.Module, leaf: str, old: Any, new: Any) -> Any:
    """Make ``new`` the module's tensor ``leaf`` (a parameter of ``old``'s class, or a
    buffer); return what the module now holds."""
    if private_torch.is_buffer(owner, leaf):
        private_torch.set_buffer(owner, leaf, new)
        return new
    if new is old or isinstance(new, type(old)):
        if new is not old:
            private_torch.set_parameter(owner, leaf, new)
        return new
    param = type(old)(new, requires_grad=old.requires_grad)
    private_torch.set_parameter(owner, leaf, param)
    return param


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    buffers_only: bool = False,
) -> defaultdict[str, int]:
    """Bytes of every module and tensor of ``model`` by name (``""``: the whole model).

    Sizes are read from shapes and dtypes, so a meta model answers as well as a loaded one.
    With ``dtype``, floating tensors count as that dtype where it is smaller.

    Example:
        >>> import torch.nn as nn
        >>> compute_module_sizes(nn.Linear(4, 4))[""]
        80
    """
    target = as_dtype(dtype)
    special = {name: as_dtype(kind) for name, kind in (special_dtypes or {}).items()}
    sizes: defaultdict[str, int] = defaultdict(int)
    tensors = (
        model.named_buffers(recurse=True)
        if buffers_only
        else named_module_tensors(model, recurse=True)
    )
    for name, tensor in tensors:
        width = dtype_byte_size(tensor.dtype)
        kind = special.get(name)
        if kind is not None:
            width = dtype_byte_size(kind)
        elif target is not None and not keeps_dtype(tensor):
            width = min(width, dtype_byte_size(target))
        size = tensor.numel() * width
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size  # type: ignore[assignment]
    return sizes


def find_tied_parameters(model: nn.Module, **_: Any) -> list[list[str]]:
    """Groups of parameter names that are one parameter (tied embeddings), each sorted.

    Example:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        >>> model[1].weight = model[0].weight
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]
    """
    names: dict[int, list[str]] = {}  # in the order of first appearance
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [sorted(group) for group in names.values() if len(group) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group one parameter again: the first that is not on the meta device.

    Example:
        >>> retie_parameters(model, find_tied_parameters(model))  # doctest: +SKIP
    """
    for group in tied_params:
        owners = [_owner(model, name) for name in group]
        params = [private_torch.own_parameter(module, leaf) for module, leaf in owners]
        kept = next((p for p in params if p is not None and p.device.type != "meta"), params[0])
        for module, leaf in owners:
            private_torch.set_parameter(module, leaf, kept)


def move_keeping_ties(model: nn.Module, device: Any) -> nn.Module:
    """``model.to(device)``; on TorchTPU (``"tpu"``), whose ``.to()`` unties shared weights,
    the tied parameters are tied again after the move (as accelerate 1.16 does)."""
    import torch

    if torch.device(device).type != "tpu":
        return model.to(device)
    ties = find_tied_parameters(model)
    model.to(device)
    retie_parameters(model, ties)
    return model
