"""torch.compile in ``prepare``: the whole model, or its repeated blocks (regional).

prepare(model) -> device, precision, strategy (DDP) -> compile_model(model, plugin)
    whole:    torch.compile(wrapped)           an OptimizedModule around the DDP wrapper
    regional: compile_regions(wrapped)         a shallow copy down to each ModuleList of
              identical blocks; every block compiled (one graph, reused by the others),
              every other leaf part compiled whole; the copy remembers the original
              in ``__dict__["_orig_mod"]`` (parameters are shared, nothing is copied)
strategy_view(prepared) -> what the strategy acts on (no_sync, trigger_sync): the
    module whose forward runs
uncompiled(prepared)    -> the strategy's model before compiling: state dicts and
    checkpoints keep the module's own names
"""

from __future__ import annotations

from typing import Any

import torch

from ..options.dynamo import TorchDynamoPlugin
from ..private import torch as private_torch

__all__ = [
    "compile_model",
    "compile_regions",
    "is_compiled",
    "is_compiled_module",
    "strategy_view",
    "uncompiled",
]


def is_compiled_module(module: object) -> bool:
    """Whether ``module`` is a ``torch.compile`` wrapper (accelerate.utils's name).

    Example:
        >>> is_compiled_module(torch.compile(torch.nn.Linear(2, 2)))
        True
    """
    return private_torch.is_compiled(module)


_optimized = is_compiled_module


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` was compiled whole, or holds compiled regions.

    Example:
        >>> is_compiled(torch.nn.Linear(2, 2))
        False
    """
    return _optimized(module) or any(_optimized(m) for m in module.modules())


def _repeated(module: torch.nn.Module) -> bool:
    """A non-empty ModuleList whose entries are all of its first entry's class."""
    if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
        return False
    kind = type(module[0])
    return all(isinstance(block, kind) for block in module)


def _whole(module: Any, kwargs: dict[str, Any]) -> torch.nn.Module:
    return torch.compile(module, **kwargs)  # type: ignore[return-value]


def _regions(module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    inside = private_torch.children(module)
    if inside is None:  # a torch that keeps children otherwise: one graph, the same result
        return _whole(module, kwargs)
    if _repeated(module):
        # Each entry, repeats included (children() would skip a block listed twice).
        return torch.nn.ModuleList([_whole(b, kwargs) for b in inside.values()])
    if not any(_repeated(m) for m in module.modules()):
        return _whole(module, kwargs)
    # A path down to repeated blocks: a shallow copy (same parameters, buffers, flags), so
    # that the user's own module object stays as it was.
    twin = type(module).__new__(type(module))
    twin.__dict__.update(module.__dict__)
    private_torch.set_children(
        twin,
        {
            name: None if child is None else _regions(child, kwargs)
            for name, child in inside.items()
        },
    )
    return twin


def compile_regions(module: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """Compile each repeated block of ``module`` (and its other parts) with ``torch.compile``.

    The blocks of a ``ModuleList`` of one class share a compiled graph, so compiling a
    12-layer model costs about what one layer does. The returned module shares every
    parameter with ``module`` and keeps it in ``__dict__["_orig_mod"]``.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 4)] * 2))
        >>> type(compile_regions(net, backend="eager")[0][1]).__name__
        'OptimizedModule'
    """
    out = _regions(module, kwargs)
    out.__dict__.setdefault("_orig_mod", module)
    return out


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``model`` compiled as ``plugin`` says (unchanged without a backend, or if compiled)."""
    if not plugin.enabled or _optimized(model):  # accelerate compiles a model once
        return model
    kwargs = plugin.to_kwargs()
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return _whole(model, kwargs)


def strategy_view(model: torch.nn.Module) -> torch.nn.Module:
    """The module a strategy acts on: inside a whole-model compile, the wrapped module
    (its forward is what the compiled one calls); a regional copy is that module itself."""
    return private_torch.compiled_original(model) if _optimized(model) else model


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module before ``compile_model`` (itself if it was not compiled by it)."""
    if _optimized(model):
        return private_torch.compiled_original(model)
    original = model.__dict__.get("_orig_mod")
    return original if isinstance(original, torch.nn.Module) else model
