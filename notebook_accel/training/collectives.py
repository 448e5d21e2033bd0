"""Collectives over nested data: gather, reduce, broadcast, padding, objects, splitting.

Every function takes tensors or any nesting of lists, tuples and dicts of tensors, and is a
cheap identity (or the obvious single-process answer) when the job has one process, so user
code runs unchanged in a plain Python process. ``gather``, ``reduce``, ``broadcast`` and
``pad_across_processes`` raise ``TypeError`` for any other leaf (a float, a string, None), in
one process too, so the mistake shows before a multi-process run; objects go through
``gather_object`` / ``broadcast_object_list``.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist

from .. import launched
from ..errors import ConfigError

__all__ = [
    "apply",
    "all_tensors",
    "gather",
    "gather_object",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "pad_across_processes",
    "split_between_processes",
]


def _world() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _xla_threads_world()


def _xla_threads_world() -> int:
    """World size of a torch_xla launch whose devices are threads (no torch.distributed group).

    One process driving several devices (TPU v2/v3) cannot hold a per-device default process
    group (state.py), so gather and reduce use torch_xla's collectives there.
    """
    if "torch_xla" not in sys.modules or launched.device_type() != "xla":
        return 1
    import torch_xla.runtime as xr

    return int(xr.world_size())


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def apply(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``fn`` to every tensor in a nest of lists, tuples (named too) and dicts.

    Example:
        >>> apply(lambda t: t * 2, {"a": [torch.ones(1)]})
        {'a': [tensor([2.])]}
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)({k: apply(fn, v) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(apply(fn, v) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(apply(fn, v) for v in data)
    return data


def all_tensors(data: Any) -> bool:
    """Whether ``data`` is a tensor or a nest of lists, tuples and dicts with only tensors."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, dict):
        return all(all_tensors(v) for v in data.values())
    if isinstance(data, list | tuple):
        return all(all_tensors(v) for v in data)
    return False


def _apply_tensors(fn: Callable[[torch.Tensor], Any], data: Any, caller: str) -> Any:
    """:func:`apply`, refusing leaves that are not tensors (as accelerate does)."""
    return apply(fn, _require_tensors(data, caller))


def _require_tensors(data: Any, caller: str) -> Any:
    """``data`` itself, or a TypeError naming ``caller`` and the leaf types that are not tensors."""
    if not all_tensors(data):
        found: list[str] = []

        def note(leaf: Any) -> Any:
            found.append(type(leaf).__name__)
            return leaf

        _apply_leaves(note, data)
        raise TypeError(
            f"{caller}() takes tensors, or lists/tuples/dicts of tensors; got "
            f"{', '.join(sorted(set(found)))}. Make numbers tensors on the accelerator's "
            "device (torch.tensor(x, device=accelerator.device)); send other objects with "
            "gather_object() or broadcast_object_list()."
        )
    return data


def _apply_leaves(fn: Callable[[Any], Any], data: Any) -> None:
    if isinstance(data, dict):
        for v in data.values():
            _apply_leaves(fn, v)
    elif isinstance(data, list | tuple):
        for v in data:
            _apply_leaves(fn, v)
    elif not isinstance(data, torch.Tensor):
        fn(data)


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor[None]
    tensor = tensor.contiguous()
    if not dist.is_initialized():
        import torch_xla.core.xla_model as xm

        return xm.all_gather(tensor, dim=0)
    if dist.get_backend() in ("xla", "gloo"):
        # A list of tensors, as accelerate's on gloo: torch 2.13's gloo all_gather_single
        # refuses a tensor that requires grad (a training loss gathered for metrics).
        parts = [torch.empty_like(tensor) for _ in range(_world())]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=0)
    # One collective into one tensor, as accelerate 1.16's elsewhere: torch 2.13's
    # all_gather_single (all_gather_into_tensor before it, now deprecated).
    out = tensor.new_empty((_world() * tensor.shape[0], *tensor.shape[1:]))
    into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    into(out, tensor)
    return out


def gather(tensor: Any) -> Any:
    """Concatenate every process's tensors along dim 0 (scalars become shape ``[world]``);
    ``tensor`` may be a nest of them (accelerate's parameter name).

    All processes must pass tensors of the same shape; see :func:`pad_across_processes`.

    Example:
        >>> gather(torch.tensor([rank]))  # on 2 processes  # doctest: +SKIP
        tensor([0, 1])
    """
    if _world() == 1:
        return _require_tensors(tensor, "gather")
    return _apply_tensors(_gather_one, tensor, "gather")


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects from every process, in rank order.

    A list (or tuple) from each process is concatenated, as accelerate does; anything else
    becomes one element per process.

    Example:
        >>> gather_object([f"rank {rank}"])  # doctest: +SKIP
        ['rank 0', 'rank 1']
    """
    if _world() == 1:
        return list(obj) if isinstance(obj, list | tuple) else [obj]
    if dist.is_initialized():
        out: list[Any] = [None] * _world()
        dist.all_gather_object(out, obj)
    else:
        out = _xla_objects(obj)
    if all(isinstance(o, list | tuple) for o in out):
        return [item for part in out for item in part]
    return out


def reduce(
    tensor: Any, reduction: Literal["sum", "mean", "max"] = "sum", scale: float = 1.0
) -> Any:
    """Sum, average or take the maximum of tensors across processes; inputs are left untouched.

    ``scale`` multiplies the result on XLA devices only, as accelerate's: elsewhere (and in a
    single process) it is ignored, so a script gets accelerate's numbers.

    Example:
        >>> reduce(torch.tensor(1.0), "sum")  # on 2 processes  # doctest: +SKIP
        tensor(2.)
    """
    if reduction not in ("sum", "mean", "max"):
        raise ConfigError("reduction", reduction, "'sum', 'mean' or 'max'")
    world = _world()
    biggest = reduction == "max"
    scaled = world > 1 and scale != 1.0 and _on_xla()

    def one(part: torch.Tensor) -> torch.Tensor:
        out = part.clone()
        if world > 1 and not dist.is_initialized():
            import torch_xla.core.xla_model as xm

            out = xm.all_reduce(xm.REDUCE_MAX if biggest else xm.REDUCE_SUM, out)
        elif world > 1:
            dist.all_reduce(out, op=dist.ReduceOp.MAX if biggest else dist.ReduceOp.SUM)
        if reduction == "mean":
            out = out / world
        return out * scale if scaled else out

    return _apply_tensors(one, tensor, "reduce")


def _on_xla() -> bool:
    """Whether the job's collectives are torch_xla's (threads of one process, or the "xla"
    process group)."""
    return not dist.is_initialized() or dist.get_backend() == "xla"


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Every process receives ``from_process``'s tensors (same shapes needed everywhere)."""
    if _world() == 1:
        return _require_tensors(tensor, "broadcast")

    def one(part: torch.Tensor) -> torch.Tensor:
        out = part.clone().contiguous()
        if not dist.is_initialized():
            return _xla_objects(out.cpu())[from_process].to(out.device)
        dist.broadcast(out, src=from_process)
        return out

    return _apply_tensors(one, tensor, "broadcast")


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Replace ``objects``' items in place by ``from_process``'s, and return the list."""
    if _world() > 1 and not dist.is_initialized():
        objects[:] = _xla_objects(list(objects))[from_process]
    elif _world() > 1:
        dist.broadcast_object_list(objects, src=from_process)
    return objects


def _xla_objects(obj: Any) -> list[Any]:
    """Every device's ``obj``, in ordinal order, through torch_xla's rendezvous.

    For XLA devices driven by threads of one process, which have no torch.distributed group.
    """
    import pickle

    import torch_xla.core.xla_model as xm

    payloads = xm.rendezvous("notebook_accel.objects", pickle.dumps(obj))
    return [pickle.loads(payload) for payload in payloads]


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Pad tensors along ``dim`` to the largest size any process has, so they can be gathered.

    Example:
        >>> pad_across_processes(torch.ones(rank + 1))  # on 2 processes  # doctest: +SKIP
        tensor([1., 0.])  # rank 0
    """
    if _world() == 1:
        return _require_tensors(tensor, "pad_across_processes")

    def one(part: torch.Tensor) -> torch.Tensor:
        if part.ndim == 0 or dim >= part.ndim or dim < -part.ndim:
            return part
        axis = dim % part.ndim
        size = torch.tensor([part.shape[axis]], device=part.device)
        longest = int(_gather_one(size).max())
        if longest == part.shape[axis]:
            return part
        shape = list(part.shape)
        shape[axis] = longest
        out = part.new_full(shape, pad_index)
        start = longest - part.shape[axis] if pad_first else 0
        out.narrow(axis, start, part.shape[axis]).copy_(part)
        return out

    return _apply_tensors(one, tensor, "pad_across_processes")


def _slice(data: Any, start: int, stop: int) -> Any:
    if isinstance(data, dict):
        return {k: _slice(v, start, stop) for k, v in data.items()}
    return data[start:stop]


def _pad_tail(part: Any, length: int, wanted: int) -> Any:
    if length == 0 or length >= wanted:
        return part
    if isinstance(part, dict):
        return {k: _pad_tail(v, length, wanted) for k, v in part.items()}
    if isinstance(part, torch.Tensor):
        return torch.cat([part, part[-1:].expand(wanted - length, *part.shape[1:])])
    return type(part)(list(part) + [part[-1]] * (wanted - length))


@contextlib.contextmanager
def split_between_processes(inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
    """Yield this process's contiguous share of a list, tuple, tensor or dict of them.

    Shares differ by at most one item; ``apply_padding=True`` repeats the last item so every
    share has the same length (then :func:`gather` works, and you drop the padding yourself).

    Example:
        >>> with split_between_processes(["a", "b", "c"]) as mine:  # doctest: +SKIP
        ...     print(mine)  # ['a', 'b'] on rank 0, ['c'] on rank 1
    """
    world, rank = _world(), _rank()
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ConfigError("inputs", {k: len(v) for k, v in inputs.items()}, "equal lengths")
        total = lengths.pop() if lengths else 0
    else:
        total = len(inputs)
    per, extra = divmod(total, world)
    start = rank * per + min(rank, extra)
    stop = start + per + (1 if rank < extra else 0)
    part = _slice(inputs, start, stop)
    if apply_padding:
        part = _pad_tail(part, stop - start, math.ceil(total / world))
    yield part
