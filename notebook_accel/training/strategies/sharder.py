"""Fully sharded data parallelism (torch's FSDP2, ``fully_shard``) behind one small config.

    Accelerator(fsdp=FsdpConfig(...) | dict | "full" | None)
        -> FsdpConfig.coerce(...)         validated once, before any process group work
        -> Sharder(config, state)         checks the hybrid mesh (a single process was refused
                                          before: options/rules.py, sized)
    prepare(model)      -> Sharder.shard: rank 0's weights broadcast (as DDP does), then
                           fully_shard on the auto-wrap targets bottom-up, then on the root;
                           the old -> new Parameter map is kept (weakly) for the optimizers
    prepare(optimizer)  -> Sharder.repoint: param_groups (and any state) point at the shards
    accumulate (no sync)-> no_sync(model): no reduce-scatter, no reshard after backward
    clip_grad_norm_     -> the DTensor norm made global with ``full_tensor()``, then clipped

``fully_shard`` registers new DTensor parameters in place of the module's ones, so an optimizer
built from ``model.parameters()`` before ``prepare`` would keep stepping the discarded full
tensors; :meth:`Sharder.repoint` fixes that by matching parameters by their qualified name.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from ... import env
from ...errors import ConfigError
from ...options.fsdp import DTYPES, HUGE_PAGES_VARIABLE, FsdpConfig, ShardingStrategy
from ..process import ProcessState

__all__ = [
    "FsdpConfig",
    "ShardingStrategy",
    "Sharder",
    "is_sharded",
    "no_sync",
    "total_norm",
    "clip_grad_norm_",
    "full_state_dict",
]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` went through ``fully_shard``."""
    return isinstance(model, FSDPModule)


class Sharder:
    """Shards models and re-points optimizers for one Accelerator.

    Raises:
        ConfigError: a hybrid mesh that the job's size does not allow.

    Example:
        >>> sharder = Sharder(FsdpConfig(), accelerator.state)  # doctest: +SKIP
        >>> model = sharder.shard(model); sharder.repoint(optimizer)  # doctest: +SKIP
    """

    def __init__(self, config: FsdpConfig, state: ProcessState) -> None:
        self.config = config
        self.state = state
        self.mesh_shape = _mesh_shape(config, state)
        if config.returns_freed_memory(state.device.type):
            return_freed_memory("FSDP")
        self._mesh: DeviceMesh | None = None
        # id(old Parameter) -> (weak ref to it, its sharded replacement); weak so that the
        # full-size originals are freed as soon as no optimizer refers to them any more.
        self._moved: dict[int, tuple[weakref.ref[torch.nn.Parameter], torch.nn.Parameter]] = {}

    @property
    def mesh(self) -> DeviceMesh:
        """The device mesh, built on first use (it creates process groups: every rank)."""
        if self._mesh is None:
            names = ("dp_replicate", "dp_shard") if len(self.mesh_shape) == 2 else ("dp_shard",)
            self._mesh = init_device_mesh(
                self.state.device.type, self.mesh_shape, mesh_dim_names=names
            )
        return self._mesh

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """``fully_shard`` the auto-wrap targets bottom-up, then the root; return the root."""
        if is_sharded(model):
            return model
        targets = wrap_targets(model, self.config)
        old = {name: weakref.ref(p) for name, p in model.named_parameters()}
        if self.config.sync_module_states:
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        kwargs = self._shard_kwargs()
        for module in targets:
            if self.config.activation_checkpointing:
                checkpoint_forward(
                    module,
                    offload=self.config.activation_checkpointing_offload,
                    pin_memory=self.state.device.type == "cuda",
                )
            fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        new = dict(model.named_parameters())
        for name, ref in old.items():
            param = ref()
            if param is not None and name in new:
                self._moved[id(param)] = (ref, new[name])
        return model

    def _shard_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        offload = CPUOffloadPolicy(pin_memory=self.state.device.type == "cuda")
        return {
            "mesh": self.mesh,
            # Only "full" (and hybrid's shards) free gathered weights between forward and
            # backward; no_shard has nothing to free.
            "reshard_after_forward": cfg.sharding_strategy in ("full", "hybrid"),
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=DTYPES.get(cfg.param_dtype or ""),
                reduce_dtype=DTYPES.get(cfg.reduce_dtype or ""),
            ),
            "offload_policy": offload if cfg.cpu_offload else OffloadPolicy(),
        }

    def repoint(self, optimizer: torch.optim.Optimizer) -> int:
        """Make ``optimizer`` hold the sharded parameters; return how many were replaced.

        State the optimizer already has (loaded before prepare) is cut to each rank's shard.
        """
        count = 0
        for group in optimizer.param_groups:
            for i, param in enumerate(group["params"]):
                entry = self._moved.get(id(param))
                if entry is None or entry[0]() is not param:
                    continue
                new = entry[1]
                group["params"][i] = new
                if param in optimizer.state:
                    old_state = optimizer.state.pop(param)  # type: ignore[arg-type]
                    optimizer.state[new] = {k: _like(v, new) for k, v in old_state.items()}
                count += 1
        return count


def checkpoint_forward(module: torch.nn.Module, offload: bool, pin_memory: bool) -> None:
    """Recompute ``module``'s activations in the backward pass: its forward runs under
    ``torch.utils.checkpoint`` (non-reentrant), which keeps only the unit's inputs; with
    ``offload`` those wait in (pinned, on CUDA) CPU memory until the backward pass
    (``save_on_cpu``), as accelerate's ``checkpoint_wrapper`` + ``offload_wrapper`` do.

    The module keeps its place and its parameter names (no wrapper module): state dicts,
    optimizers and checkpoints are as without checkpointing. FSDP2 gathers the unit's
    weights again for the recompute (its pre-backward hook runs first).
    """
    from torch.utils.checkpoint import checkpoint

    forward = module.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing to recompute
            return forward(*args, **kwargs)
        if offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=pin_memory):
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed


def return_freed_memory(who: str) -> None:
    """Serve CPU blocks of 1 MiB and more with mmap (freed at once), with huge pages.

    ``who`` names the caller in the warning given when huge pages could not be turned on.
    """
    # Every gathered weight and unsharded gradient is then a fresh mmap, faulted in page by
    # page on first touch: with 4 KiB pages that was ~700k page faults per step of the
    # benchmark's model (1.8x the step time of FSDP on glibc's heap). torch's CPU allocator
    # advises transparent huge pages (MADV_HUGEPAGE) for blocks of 2 MiB and more when
    # THP_MEM_ALLOC_ENABLE is set, which cuts the faults by ~7x; torch reads the variable at
    # its first allocation in the process, so this only works while none has happened yet.
    _fixed_mmap_threshold(1 << 20)
    ours = env.huge_pages() is None
    if ours:
        env.set_var(HUGE_PAGES_VARIABLE, "1")
    if env.huge_pages() == "1" and not _huge_page_allocations():
        if ours:  # it had no effect: leave the environment (and child processes) as it was
            env.set_var(HUGE_PAGES_VARIABLE, None)
        warnings.warn(
            f"notebook_accel: {who} on CPU could not turn on huge pages for torch's allocations "
            "(this process allocated tensors before its Accelerator), so steps are "
            "slower; create the Accelerator before any tensor, or set THP_MEM_ALLOC_ENABLE=1 "
            "before the launch.",
            stacklevel=4,  # the user's Accelerator(...) call
        )


def _huge_page_allocations() -> bool:
    # With THP_MEM_ALLOC_ENABLE in effect torch aligns large blocks to the page size (so that
    # madvise applies), otherwise to 64 bytes; an mmapped glibc block is never page-aligned.
    probe = torch.empty(4 << 20, dtype=torch.uint8)
    return probe.data_ptr() % 4096 == 0


def _fixed_mmap_threshold(size: int) -> None:
    # glibc raises its mmap threshold (up to 32 MiB) each time an mmapped block is freed, so
    # after the first layer's gathered weights are freed the next ones come from the heap and
    # stay resident; a fixed threshold turns the adaptation off (mallopt M_MMAP_THRESHOLD).
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, size)  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        pass


def _mesh_shape(config: FsdpConfig, state: ProcessState) -> tuple[int, ...]:
    world = state.world_size
    if config.sharding_strategy == "no_shard":
        # FSDP2's replication: a (replicas, 1) mesh; gradients are all-reduced as in DDP.
        return (world, 1)
    if config.sharding_strategy != "hybrid":
        return (world,)
    size = config.hybrid_shard_size or state.local_world_size
    if not 1 < size < world or world % size:
        raise ConfigError(
            "fsdp.hybrid_shard_size",
            size,
            f"a divisor of the job's {world} processes strictly between 1 and {world}",
            "Hybrid sharding needs at least 2 shard groups of at least 2 processes; "
            'with one group use "full", with groups of 1 use "no_shard".',
        )
    return (world // size, size)


def wrap_targets(model: torch.nn.Module, config: FsdpConfig) -> list[torch.nn.Module]:
    """The submodules to shard as their own units, innermost first (root excluded).

    Raises:
        ConfigError: an ``auto_wrap_classes`` name that no module of ``model`` has.
    """
    wanted = set(config.auto_wrap_classes)
    present = {type(m).__name__ for m in model.modules()}
    missing = sorted(wanted - present)
    if missing:
        raise ConfigError(
            "fsdp.auto_wrap_classes",
            missing[0],
            "a module class name found in the model: " + ", ".join(sorted(present)),
        )
    chosen: list[torch.nn.Module] = []
    seen: set[int] = set()

    def visit(module: torch.nn.Module) -> int:
        # Returns the parameters under ``module`` not yet inside a chosen unit.
        if id(module) in seen:  # a shared submodule is counted once
            return 0
        seen.add(id(module))
        loose = sum(p.numel() for p in module.parameters(recurse=False))
        loose += sum(visit(child) for child in module.children())
        by_class = type(module).__name__ in wanted
        by_size = 0 < config.min_num_params <= loose
        if module is not model and loose and (by_class or by_size):
            chosen.append(module)
            return 0
        return loose

    visit(model)
    return chosen


def _like(value: Any, param: torch.nn.Parameter) -> Any:
    # Per-parameter state (Adam's moments) has the parameter's full shape: keep this rank's
    # part, cut locally (src_data_rank=None: every rank already holds the same full tensor).
    if isinstance(value, torch.Tensor) and isinstance(param, DTensor):
        if not isinstance(value, DTensor) and value.shape == param.shape and value.dim() > 0:
            return distribute_tensor(
                value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
            )
    return value


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients locally: no reduce-scatter and no re-sharding after backward.

    Example:
        >>> with no_sync(model):  # doctest: +SKIP
        ...     model(x).sum().backward()
    """
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    # Keeping the gathered weights saves the next micro-batch's all-gather (costs memory).
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def total_norm(grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of ``grads`` over every shard (a plain tensor, the same on every rank); the
    norm types 0 and inf too (DTensor reduces each as its kind needs: tests/training/
    strategies/test_fsdp.py checks them against the whole gradients)."""
    norm = torch.nn.utils.get_total_norm(grads, norm_type)
    # Over DTensor shards the norm is a partial result: full_tensor() reduces it across ranks.
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also works on sharded (DTensor) gradients.

    Example:
        >>> clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
        tensor(0.4212)
    """
    params = list(parameters)
    norm = total_norm([p.grad for p in params if p.grad is not None], norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The unsharded state dict on the main process (``{}`` elsewhere); call on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
