"""accelerate.utils's free functions with its signatures and defaults, over our own parts.

The collectives are ``collectives.py``'s (accelerate's ``reduce`` averages by default, where
``Accelerator.reduce`` sums, and takes ``scale`` on XLA only); ``send_to_device`` moves
nested data as a prepared loader's batches move; ``extract_model_from_parallel`` is
``Accelerator.unwrap_model`` without an Accelerator (the wrappers are recognised by type).
Reached as ``notebook_accel.utils.gather`` etc.

Example:
    >>> from notebook_accel.utils import reduce
    >>> reduce(torch.tensor([2.0, 4.0]))  # one process: the mean of one  # doctest: +SKIP
    tensor([2., 4.])
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from .. import launched
from ..big_model.moves import send_to_device
from . import collectives
from . import compile as compiling
from .precision.modes import AutocastForward
from .processes import PartialState

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "extract_model_from_parallel",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "send_to_device",
    "wait_for_everyone",
]


def gather(tensor: Any) -> Any:
    """Every process's tensors, concatenated along the first dimension (nested data too)."""
    return collectives.gather(tensor)


def gather_object(object: Any) -> Any:  # accelerate's parameter name
    """Every process's picklable ``object``, as accelerate's: in one process the object
    itself; else each rank's object iterated, in rank order, into one list (lists are
    concatenated; a dict gives its keys). ``Accelerator.gather_for_metrics`` uses
    :func:`collectives.gather_object`, which keeps non-list objects whole."""
    if PartialState().num_processes == 1:
        return object
    per_rank = collectives.gather_object([object])
    return [item for part in per_rank for item in part]


def reduce(
    tensor: Any, reduction: Literal["sum", "mean", "max", "none"] = "mean", scale: float = 1.0
) -> Any:
    """Average (by default), sum or take the maximum of tensors across processes.

    As accelerate's: ``"none"`` sums, and ``scale`` applies on TPUs (XLA) only (its documented
    "only valid on XLA"; elsewhere it is ignored).
    """
    if reduction == "none":
        reduction = "sum"
    on_xla = launched.device_type() == "xla"
    return collectives.reduce(tensor, reduction, scale if on_xla else 1.0)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Every process receives ``from_process``'s tensors (same shapes everywhere)."""
    return collectives.broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace ``object_list``'s items in place by ``from_process``'s, and return it."""
    return collectives.broadcast_object_list(object_list, from_process)


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Pad tensors along ``dim`` to the largest size any process has."""
    return collectives.pad_across_processes(tensor, dim, pad_index, pad_first)


def wait_for_everyone() -> None:
    """Block until every process of the job reaches this call (nothing in one process).

    As accelerate's (``PartialState().wait_for_everyone()``): it joins the job's process
    group if none exists yet; TPU devices driven by threads meet through torch_xla.
    """
    PartialState().wait_for_everyone()


def _inner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module a parallel wrapper holds (DDP, DataParallel, a DeepSpeed engine), or None."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    engine = type(model).__name__ == "DeepSpeedEngine" and type(model).__module__.startswith(
        "deepspeed"
    )
    inner = model.module if isinstance(model, wrappers) or engine else None
    return inner if isinstance(inner, torch.nn.Module) else None


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's module inside the parallel wrappers ``prepare`` put around it.

    Args:
        model: a prepared model (or any module: itself back).
        keep_fp32_wrapper: keep the mixed-precision forward (autocast) a prepared model has.
        keep_torch_compile: keep a compiled model compiled (else the module before compiling).
        recursive: also unwrap wrapped submodules (a DDP inside a container).

    Example:
        >>> extract_model_from_parallel(torch.nn.Linear(1, 1))
        Linear(in_features=1, out_features=1, bias=True)
    """
    compiled = compiling.uncompiled(model) is not model
    base = compiling.uncompiled(model) if compiled else model
    while (inner := _inner(base)) is not None:
        base = inner
    if recursive:
        for name, child in list(base.named_children()):
            unwrapped = extract_model_from_parallel(child, keep_fp32_wrapper, True, True)
            if unwrapped is not child:
                setattr(base, name, unwrapped)
    if not keep_fp32_wrapper:
        AutocastForward.remove(base)
    if compiled and keep_torch_compile and base is compiling.uncompiled(model):
        return model  # compiled whole around the user's module: keep the compiled one
    return base
