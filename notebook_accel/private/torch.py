"""torch's private names: what the package uses that torch does not promise.

Each function imports torch only when called (the notebook's side stays torch-free), says
which name it relies on, and checks its shape first: where it differs, the public path (or
None/False, and the caller takes the public route). Every name was read in torch 2.8, 2.9,
2.10, 2.11, 2.12 and 2.13 (2.8, 2.9 and 2.13 run, the others' sources).

    function                       relies on                        where it differs
    is_compiled                    _dynamo.eval_frame.OptimizedModule a child named _orig_mod
    compiled_original              OptimizedModule._orig_mod        the module itself
    import_dynamo                  torch._dynamo                    nothing to import early
    children, set_children         nn.Module._modules (a dict)      None: compile_regions
                                                                    compiles the whole model
    own_parameter, own_buffer,     nn.Module._parameters, _buffers  named_parameters/buffers
    set_parameter, set_buffer      (dicts), _non_persistent_        (recurse=False); register_
    non_persistent_buffers         buffers_set                      parameter/buffer; names
                                                                    not in state_dict()
    untyped_storage                TypedStorage._untyped_storage    untyped(), warning quiet
    tensor_version                 Tensor._version                  None: compared by bytes
                                                                    (CPU), copied again (CUDA)
    view_base                      Tensor._base                     None: the view is taken
                                                                    for a base of its own
    storage_use_count              _C._storage_Use_Count,           None: the storage stays
                                   UntypedStorage._cdata            in the zygote's fork
    tensor_use_count               Tensor._use_count                None: the same
    sampler_num_samples            RandomSampler._num_samples       its public num_samples
    scheduler_step_count           LRScheduler._step_count          last_epoch + 1
    nvml_device_count              torch.cuda._device_count_nvml    device_count() in a child
                                                                    process (CUDA stays
                                                                    untouched here)
    rendezvous_handlers            rendezvous._rendezvous_handlers  None: env:// is routed at
                                                                    init_process_group instead
    process_groups, world_group    c10d._world.pg_map (group ->     {}: nothing kept; the
                                   (backend, store)), GroupMember   public dist.group.WORLD
    replace_destroy_process_group  c10d.destroy_process_group(group) False: torch's own destroy
    replace_init_process_group     c10d.init_process_group          False: torch's own init
    default_store                  c10d._get_default_store          None: the caller pairs
                                                                    its ranks by collectives
    collectives_issued             ProcessGroup._get_sequence_      None: the stall report
                                   number_for_group, _world.pg_map  sees output and steps only
    flight_recorder                _C._distributed_c10d.            (): the report without
                                   _dump_fr_trace_json              the recorder's entries
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

__all__ = [
    "PYTREE_LOGGER",
    "children",
    "collectives_issued",
    "compiled_original",
    "flight_recorder",
    "has_tensor",
    "is_buffer",
    "non_persistent_buffers",
    "own_parameter",
    "set_buffer",
    "set_parameter",
    "default_store",
    "import_dynamo",
    "is_compiled",
    "nvml_device_count",
    "process_groups",
    "rendezvous_handlers",
    "replace_destroy_process_group",
    "replace_init_process_group",
    "sampler_num_samples",
    "scheduler_step_count",
    "set_children",
    "storage_use_count",
    "tensor_use_count",
    "tensor_version",
    "untyped_storage",
    "view_base",
    "world_group",
]

# The logger of torch.utils._pytree (its enum deprecation lines, filtered by quiet.py; a
# moved logger only lets those lines through).
PYTREE_LOGGER = "torch.utils._pytree"


# -- torch.compile ----------------------------------------------------------------------------
def _optimized_module() -> type | None:
    try:
        from torch._dynamo import eval_frame
    except ImportError:
        return None
    found = getattr(eval_frame, "OptimizedModule", None)
    return found if isinstance(found, type) else None


def is_compiled(module: object) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper of a module.

    Relies on ``torch._dynamo.eval_frame.OptimizedModule`` (the wrapper's class); without
    it, a module whose child is called ``_orig_mod`` (a regional copy keeps its original in
    ``__dict__``, not as a child).
    """
    import torch

    wrapper = _optimized_module()
    if wrapper is not None:
        return isinstance(module, wrapper)
    if not isinstance(module, torch.nn.Module):
        return False
    return any(name == "_orig_mod" for name, _ in module.named_children())


def compiled_original(model: Any) -> Any:
    """The module a ``torch.compile`` wrapper wraps.

    Relies on ``OptimizedModule._orig_mod``; without it, the wrapper itself.
    """
    return getattr(model, "_orig_mod", model)


def import_dynamo() -> None:
    """Import ``torch._dynamo`` now (before DeepSpeed's zero.Init swaps ``Tensor.__new__``,
    whose signature dynamo checks when first imported); a torch without it: nothing to do."""
    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401


# -- nn.Module, storages, data, schedules -----------------------------------------------------
def children(module: Any) -> MutableMapping[str, Any] | None:
    """A module's children by name, repeats and None entries included (``children()`` skips
    both); None where torch keeps them otherwise (the caller compiles the whole module).

    Relies on ``torch.nn.Module._modules`` (a dict).
    """
    found = getattr(module, "_modules", None)
    return found if isinstance(found, MutableMapping) else None


def _own(module: Any, name: str) -> MutableMapping[str, Any] | None:
    found = getattr(module, name, None)
    return found if isinstance(found, MutableMapping) else None


def own_parameter(module: Any, name: str) -> Any:
    """``module``'s own parameter ``name`` (None where it is registered as None); KeyError
    where it has none of that name.

    Relies on ``torch.nn.Module._parameters`` (a dict, None entries included).
    """
    found = _own(module, "_parameters")
    if found is None:
        found = dict(module.named_parameters(recurse=False, remove_duplicate=False))
    return found[name]


def has_tensor(module: Any, name: str) -> bool:
    """Whether ``name`` is one of ``module``'s own parameters or buffers (None ones too).

    Relies on ``torch.nn.Module._parameters`` and ``_buffers``; without them, the named ones.
    """
    for kind, public in (("_parameters", "named_parameters"), ("_buffers", "named_buffers")):
        found = _own(module, kind)
        if found is None:
            found = dict(getattr(module, public)(recurse=False))
        if name in found:
            return True
    return False


def is_buffer(module: Any, name: str) -> bool:
    """Whether ``name`` is one of ``module``'s own buffers (relies on ``_buffers``)."""
    found = _own(module, "_buffers")
    return name in (found if found is not None else dict(module.named_buffers(recurse=False)))


def set_parameter(module: Any, name: str, value: Any) -> None:
    """Make ``value`` (a Parameter, or None) ``module``'s parameter ``name``, in place of the
    one there; tied modules then share it. Relies on ``_parameters``; else
    ``register_parameter``."""
    found = _own(module, "_parameters")
    if found is not None:
        found[name] = value
    else:
        module.register_parameter(name, value)


def set_buffer(module: Any, name: str, value: Any) -> None:
    """Make ``value`` ``module``'s buffer ``name`` (persistent as before). Relies on
    ``_buffers``; else ``register_buffer``."""
    found = _own(module, "_buffers")
    if found is not None:
        found[name] = value
    else:
        module.register_buffer(name, value, persistent=name not in non_persistent_buffers(module))


def non_persistent_buffers(module: Any) -> set[str]:
    """``module``'s own buffers left out of its state dict.

    Relies on ``torch.nn.Module._non_persistent_buffers_set``; else the buffers its
    ``state_dict()`` lacks.
    """
    found = getattr(module, "_non_persistent_buffers_set", None)
    if isinstance(found, set):
        return set(found)
    saved = set(module.state_dict(keep_vars=True))
    return {name for name, _ in module.named_buffers(recurse=False) if name not in saved}


def view_base(tensor: Any) -> Any:
    """The tensor ``tensor`` is a view of, or None (not a view, or a torch without it).

    Relies on ``torch.Tensor._base``.
    """
    try:
        return tensor._base
    except Exception:
        return None


def set_children(module: Any, mapping: dict[str, Any]) -> None:
    """Replace a (copied) module's children at once (where ``children`` gave them).

    Relies on ``torch.nn.Module._modules`` being the dict ``__getattr__`` reads children from.
    """
    module._modules = mapping


def untyped_storage(typed: Any) -> Any:
    """A TypedStorage's untyped storage, without the deprecation warning ``untyped()`` gives.

    Relies on ``torch.storage.TypedStorage._untyped_storage``; without it, ``untyped()``
    with its warning kept quiet.
    """
    import torch

    found = getattr(typed, "_untyped_storage", None)
    if isinstance(found, torch.UntypedStorage):
        return found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return typed.untyped()


def tensor_version(tensor: Any) -> int | None:
    """A tensor's version counter (bumped by every in-place change); None where torch has
    none to read (the shared cache then compares a CPU buffer's bytes, and copies a CUDA
    one again).

    Relies on ``torch.Tensor._version``.
    """
    version = getattr(tensor, "_version", None)
    return version if isinstance(version, int) else None


def storage_use_count(storage: Any) -> int | None:
    """How many hold a storage: its tensors (each one, whatever its Python references) and
    the Python storage objects alive, ``storage`` included; None where torch does not say
    (own_data.py then leaves the storage in the zygote's fork).

    Relies on ``torch._C._storage_Use_Count(UntypedStorage._cdata)`` (the StorageImpl's
    reference count).
    """
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    pointer = getattr(storage, "_cdata", None)
    if not callable(count) or not isinstance(pointer, int):
        return None
    found = count(pointer)
    return found if isinstance(found, int) else None


def tensor_use_count(tensor: Any) -> int | None:
    """How many hold a tensor in C++ (its Python object counts once; a view holds its base,
    autograd its saved tensors); None where torch does not say.

    Relies on ``torch.Tensor._use_count`` (the TensorImpl's reference count).
    """
    count = getattr(tensor, "_use_count", None)
    if not callable(count):
        return None
    found = count()
    return found if isinstance(found, int) else None


_MISSING = object()


def sampler_num_samples(sampler: Any) -> int | None:
    """A RandomSampler's ``num_samples`` as given (None: the dataset's length).

    Relies on ``torch.utils.data.RandomSampler._num_samples`` (its public ``num_samples``
    answers the length for None, which is the fallback).
    """
    value = getattr(sampler, "_num_samples", _MISSING)
    if value is None or isinstance(value, int):
        return value
    return int(sampler.num_samples)


def scheduler_step_count(scheduler: Any) -> int:
    """How many times an LR scheduler stepped (its construction's step included).

    Relies on ``torch.optim.lr_scheduler.LRScheduler._step_count``; without it,
    ``last_epoch + 1`` (equal from a fresh start; what OneCycleLR's limit counts).
    """
    count = getattr(scheduler, "_step_count", None)
    if isinstance(count, int):
        return count
    return int(scheduler.last_epoch) + 1


_COUNT_IN_A_CHILD = "import torch; print(torch.cuda.device_count())"


def nvml_device_count() -> int:
    """The CUDA devices NVML counts (CUDA_VISIBLE_DEVICES applied), without initialising
    CUDA; -1 when torch cannot tell (no CUDA build, NVML failed).

    Relies on ``torch.cuda._device_count_nvml``; without it, torch's public
    ``device_count()`` in a child process (it may initialise CUDA's driver, there only).
    """
    import torch

    if not torch.version.cuda:
        return -1
    count = getattr(torch.cuda, "_device_count_nvml", None)
    if callable(count):
        return int(count())
    try:
        done = subprocess.run(
            [sys.executable, "-c", _COUNT_IN_A_CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return int(done.stdout.split()[-1]) if done.returncode == 0 else -1
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return -1


# -- torch.distributed ------------------------------------------------------------------------
def rendezvous_handlers() -> MutableMapping[str, Callable[..., Iterator[Any]]] | None:
    """The init_method schemes' handlers (``"env"``, ``"tcp"``, ``"file"``), to replace one:
    torch has ``register_rendezvous_handler`` to add a scheme, none to replace one. None
    where there is no such table to write (worker_store.route then routes env:// at
    ``init_process_group``).

    Relies on ``torch.distributed.rendezvous._rendezvous_handlers`` (a dict whose "env" is
    callable).
    """
    # The module (torch.distributed.rendezvous is also the name of a function there).
    module = importlib.import_module("torch.distributed.rendezvous")
    found = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(found, MutableMapping) or not callable(found.get("env")):
        return None
    return found


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def process_groups() -> dict[Any, tuple[str, Any]]:
    """Every live process group: its backend's name and the store it met in; {} where
    torch keeps them otherwise.

    Relies on ``torch.distributed.distributed_c10d._world.pg_map`` (group -> (backend name,
    store)).
    """
    world = getattr(_c10d(), "_world", None)
    found = getattr(world, "pg_map", None)
    if not isinstance(found, Mapping):
        return {}
    groups = dict(found)
    if not all(
        isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in groups.values()
    ):
        return {}
    return groups


def world_group() -> Any:
    """The default group's handle as ``destroy_process_group`` compares it.

    Relies on ``torch.distributed.distributed_c10d.GroupMember.WORLD``; without it, the
    public ``torch.distributed.group.WORLD`` (the same handle).
    """
    member = getattr(_c10d(), "GroupMember", None)
    if member is not None and hasattr(member, "WORLD"):
        return member.WORLD
    import torch.distributed as dist

    return dist.group.WORLD


def _replace(
    name: str, first: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> bool:
    """c10d's ``name`` (whose first argument is ``first``) replaced by ``wrap(it)`` in every
    loaded torch module that bound it by name (torch.distributed, device_mesh, ...)."""
    original: Callable[..., Any] | None = getattr(_c10d(), name, None)
    if not callable(original):
        return False
    try:
        parameters = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if not parameters or parameters[0] != first:
        return False
    replacement = wrap(original)
    for module_name, module in list(sys.modules.items()):
        # The modules' own dicts: a module's __getattr__ may import or warn.
        names = getattr(module, "__dict__", {})
        if module_name.startswith("torch") and names.get(name) is original:
            setattr(module, name, replacement)
    return True


def replace_destroy_process_group(
    wrap: Callable[[Callable[..., None]], Callable[..., None]],
) -> bool:
    """``destroy_process_group`` replaced by ``wrap(the original)``, where torch's own code
    calls it too; False (nothing replaced) where it is not the function of one ``group``
    argument, or where torch keeps its groups otherwise (``process_groups``' table).

    Relies on ``torch.distributed.distributed_c10d.destroy_process_group(group=None)`` being
    the function torch.distributed re-exports (every name bound to it is replaced), and on
    ``_world.pg_map``.
    """
    world = getattr(_c10d(), "_world", None)
    if not isinstance(getattr(world, "pg_map", None), Mapping):
        return False
    return _replace("destroy_process_group", "group", wrap)


def replace_init_process_group(
    wrap: Callable[[Callable[..., None]], Callable[..., None]],
) -> bool:
    """``init_process_group`` replaced by ``wrap(the original)`` wherever torch bound it
    (torch.distributed, distributed_c10d, device_mesh); False where it does not take
    ``backend`` first.

    Relies on ``torch.distributed.distributed_c10d.init_process_group`` (public; replacing
    it where torch's modules call it is not).
    """
    return _replace("init_process_group", "backend", wrap)


def default_store() -> Any:
    """The store the default process group met in; None where torch has no way to say.

    Relies on ``torch.distributed.distributed_c10d._get_default_store``.
    """
    get = getattr(_c10d(), "_get_default_store", None)
    return get() if callable(get) else None


def collectives_issued() -> int | None:
    """How many collectives this process has issued so far, over every live process group
    (a rank waiting in one issues no more: the stall report's measure of progress); None
    without a process group, or where torch does not count them.

    Relies on ``ProcessGroup._get_sequence_number_for_group()`` (gloo and NCCL count every
    collective, DDP's own included) and on ``_world.pg_map`` for the groups; only the default
    group where that table is missing.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    groups = list(process_groups()) or [world_group()]
    total = 0
    for group in groups:
        count = getattr(group, "_get_sequence_number_for_group", None)
        if not callable(count):
            return None
        try:
            number = count()
        except Exception:  # noqa: BLE001 - a group not set up on this rank, a backend without one
            continue
        if isinstance(number, int):
            total += number
    return total


def flight_recorder(last: int = 4) -> tuple[dict[str, Any], ...]:
    """The flight recorder's ``last`` entries (oldest first), when it is on
    (``TORCH_FR_BUFFER_SIZE``, or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for NCCL): each a dict with
    at least ``profiling_name``, ``collective_seq_id``, ``input_sizes``, ``input_dtypes`` and
    ``state``; () when it is off or answers otherwise.

    Relies on ``torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives,
    onlyActive)`` (JSON bytes with an ``entries`` list).
    """
    import json

    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if not callable(dump):
        return ()
    try:
        entries = json.loads(dump(includeCollectives=True, onlyActive=False)).get("entries")
    except Exception:  # noqa: BLE001 - no recorder, another format: the report goes without
        return ()
    if not isinstance(entries, list):
        return ()
    wanted = ("profiling_name", "collective_seq_id", "input_sizes", "input_dtypes", "state")
    kept = [e for e in entries if isinstance(e, dict) and all(k in e for k in wanted)]
    return tuple(kept[-last:]) if last > 0 else ()
