"""The one module that reads or writes ``os.environ``.

Every environment variable the library cares about is named here, once:

    parent (notebook)                         worker (child process)
    -----------------                         ----------------------
    snapshot()  --- travels in the payload -->  install(snapshot, WorkerEnv.variables())
                                                  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
                                                  GROUP_RANK, MASTER_ADDR, MASTER_PORT,
                                                  and those derived from its launch (launched.py)
    training/process.py  <-- read_distributed()

The workers take the parent's environment as it is at launch time (not as it was when the
forkserver started), so a variable set in a cell just before a launch reaches them.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DistributedEnv",
    "snapshot",
    "install",
    "read_distributed",
    "accelerate_log_level",
    "cuda_visible_devices",
    "dynamo_setting",
    "enable_rich",
    "gloo_interface",
    "huge_pages",
    "in_a_rank",
    "init_include_buffers",
    "launch_attempt",
    "notebook_place",
    "pjrt_device",
    "ray_usage_stats_set",
    "save_wait_warning",
    "secret_value",
    "store_address",
    "store_key",
    "tpu_accelerator_type",
    "tpu_topology_given",
    "use_torch_xla",
    "HUGE_PAGES_VARIABLE",
    "set_var",
    "overridden",
    "patch_environment",
    "str_to_bool",
    "parse_flag_from_env",
    "parse_choice_from_env",
    "get_int_from_env",
    "config_file",
    "secret_file",
    "SECRET_VARIABLE",
    "STORE_VARIABLE",
    "STORE_KEY_VARIABLE",
    "NO_WARMUP_VARIABLE",
    "warmup_disabled",
    "CGROUP_VARIABLE",
    "cgroup_folder",
    "FORK_NOTEBOOK_DATA_VARIABLE",
    "fork_notebook_data",
    "launch_variables",
    "loopback_interface",
    "slurm_tasks_on_node",
]

_PREFIX = "NOTEBOOK_ACCEL_"
# The job's secret for several machines (launch/meet/secret.py); it never reaches the workers.
SECRET_VARIABLE = _PREFIX + "SECRET"
# Where a worker's env:// rendezvous meets, and the key its workers prove (launch/meet/rendezvous.py
# sets them, launch/rank/worker_store.py reads them).
STORE_VARIABLE = _PREFIX + "STORE"
STORE_KEY_VARIABLE = _PREFIX + "STORE_KEY"


@dataclass(frozen=True)
class DistributedEnv:
    """What a process can learn about its place in a job from its environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None


@functools.cache
def _interface_names() -> tuple[str, ...]:
    try:
        return tuple(name for _, name in socket.if_nameindex())
    except OSError:
        return ()


def loopback_interface(names: Iterable[str] | None = None, platform: str = sys.platform) -> str:
    """The loopback interface's name: ``lo`` on Linux, ``lo0`` on macOS and the BSDs.

    Args:
        names: the interfaces to choose from (default: this machine's).
        platform: ``sys.platform``, used when no interface is called either name.

    Example:
        >>> loopback_interface(["lo0", "en0"])
        'lo0'
    """
    present = set(_interface_names() if names is None else names)
    for name in ("lo", "lo0"):
        if name in present:
            return name
    return "lo" if platform.startswith("linux") else "lo0"


def slurm_tasks_on_node(value: str, node_id: int = 0) -> int:
    """The task count of node ``node_id`` in SLURM's compressed list, e.g. ``"4(x2),1"``.

    SLURM writes runs of equal counts as ``count(xrepeat)``; ``int()`` cannot read that.

    Example:
        >>> slurm_tasks_on_node("4(x2),1", node_id=2)
        1
    """
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"not a SLURM task list: {value!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node_id] if 0 <= node_id < len(counts) else counts[0]


def snapshot() -> dict[str, str]:
    """The parent's environment now, to be installed in every worker (less the job's secret:
    workers prove a key of their launch's instead, see launch/meet/rendezvous.py)."""
    return {k: v for k, v in os.environ.items() if k != SECRET_VARIABLE}


def install(base: Mapping[str, str], variables: Mapping[str, str]) -> None:
    """Replace this process's environment by ``base`` plus a rank's ``variables``."""
    restore({**base, **variables})


def restore(saved: Mapping[str, str]) -> None:
    """Make this process's environment exactly ``saved`` (also: again, after a rank)."""
    for key in list(os.environ):
        if key not in saved:
            del os.environ[key]
    os.environ.update(saved)


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return int(value)


def read_distributed() -> DistributedEnv:
    """This process's rank and world, from torchrun/our launcher, SLURM, or a single process."""
    rank = _int("RANK")
    world = _int("WORLD_SIZE")
    local_rank = _int("LOCAL_RANK")
    local_world = _int("LOCAL_WORLD_SIZE")
    if rank is None and _int("SLURM_NTASKS") is not None and "MASTER_ADDR" in os.environ:
        rank = _int("SLURM_PROCID")
        world = _int("SLURM_NTASKS")
        local_rank = _int("SLURM_LOCALID")
        # SLURM_TASKS_PER_NODE (always set) and SLURM_NTASKS_PER_NODE may be compressed lists.
        per_node = (
            os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or ""
        ).strip()
        local_world = slurm_tasks_on_node(per_node, _int("SLURM_NODEID") or 0) if per_node else None
    rank = rank or 0
    world = world or 1
    port = _int("MASTER_PORT")
    return DistributedEnv(
        rank=rank,
        local_rank=local_rank if local_rank is not None else rank,
        world_size=world,
        local_world_size=local_world if local_world is not None else world,
        master_addr=os.environ.get("MASTER_ADDR"),
        master_port=port,
    )


# Set (1, true, yes) to keep the launcher's forkserver from starting before the first launch.
NO_WARMUP_VARIABLE = _PREFIX + "NO_WARMUP"


def warmup_disabled() -> bool:
    """``NOTEBOOK_ACCEL_NO_WARMUP`` asks the launcher not to start its forkserver early."""
    return os.environ.get(NO_WARMUP_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


# The folder of this process's memory cgroup, where /proc does not lead to it (memory_probe.py).
CGROUP_VARIABLE = _PREFIX + "CGROUP"


def cgroup_folder() -> Path | None:
    """``NOTEBOOK_ACCEL_CGROUP``: the memory cgroup folder whose limit this process is under
    (its ``memory.max`` or ``memory.limit_in_bytes``), in place of the one /proc names."""
    value = os.environ.get(CGROUP_VARIABLE, "").strip()
    return Path(value).expanduser() if value else None


# Set (1, true, yes) to have the forkserver keep the notebook's large buffers, as a plain fork
# of it would (launch/local/own_data.py leaves them out of its fork otherwise).
FORK_NOTEBOOK_DATA_VARIABLE = _PREFIX + "FORK_NOTEBOOK_DATA"


def fork_notebook_data() -> bool:
    """``NOTEBOOK_ACCEL_FORK_NOTEBOOK_DATA``: the zygote is a fork of all of the notebook's
    memory, its own large buffers included (they then stay held until the next renewal)."""
    value = os.environ.get(FORK_NOTEBOOK_DATA_VARIABLE, "").strip().lower()
    return value in ("1", "true", "yes", "on")


def _get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


# -- the variables the package reads, each by a named accessor --------------------------------
HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"  # torch's huge-page CPU allocations (FSDP)


def dynamo_setting(name: str) -> str | None:
    """accelerate's ``ACCELERATE_DYNAMO_<name>`` (BACKEND, MODE, USE_FULLGRAPH, ...)."""
    return _get("ACCELERATE_DYNAMO_" + name)


def huge_pages() -> str | None:
    """``THP_MEM_ALLOC_ENABLE``: torch's huge-page CPU allocations, as this process has it."""
    return _get(HUGE_PAGES_VARIABLE)


def launch_attempt() -> tuple[str | None, str | None]:
    """``MASTER_PORT`` and ``TORCHELASTIC_RESTART_COUNT``: different for every launch and
    attempt of this process's rank (a checkpoint's saves are counted per attempt)."""
    return _get("MASTER_PORT"), _get("TORCHELASTIC_RESTART_COUNT")


def save_wait_warning() -> float:
    """``NOTEBOOK_ACCEL_SAVE_WAIT_WARNING``: seconds a rank waits for a checkpoint's writer
    before saying so (default 60)."""
    return float(_get(_PREFIX + "SAVE_WAIT_WARNING") or 60)


def accelerate_log_level() -> str | None:
    """accelerate's ``ACCELERATE_LOG_LEVEL`` (get_logger's default level)."""
    return _get("ACCELERATE_LOG_LEVEL")


def fp8_backend() -> str:
    """accelerate's ``ACCELERATE_FP8_BACKEND`` (``"AO"``, ``"TE"``; default ``"NO"``), which
    ``Accelerator.fp8_backend`` reports without a recipe handler."""
    return (_get("ACCELERATE_FP8_BACKEND") or "NO").strip().upper()


def init_include_buffers() -> bool:
    """accelerate's ``ACCELERATE_INIT_INCLUDE_BUFFERS`` (init_empty_weights' default)."""
    return (_get("ACCELERATE_INIT_INCLUDE_BUFFERS") or "").strip().lower() in _TRUE


def enable_rich() -> bool:
    """accelerate's ``ACCELERATE_ENABLE_RICH``."""
    return (_get("ACCELERATE_ENABLE_RICH") or "").strip().lower() in _TRUE


def use_torch_xla() -> bool:
    """``USE_TORCH_XLA`` (default on), which accelerate's is_torch_xla_available reads."""
    return (_get("USE_TORCH_XLA") or "1").strip().lower() not in _FALSE


def torchtpu_slice_addresses() -> str | None:
    """TorchTPU's ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one ``host:port`` per rank), which
    ``torch.tpu.distributed.set_tpu_launch_env`` sets in the parent; None when unset."""
    return _get("TORCH_TPU_SLICEBUILDER_ADDRESSES") or None


def tpu_accelerator_type() -> str:
    """The TPU VM's accelerator type (``TPU_ACCELERATOR_TYPE``, else ``ACCELERATOR_TYPE``)."""
    return _get("TPU_ACCELERATOR_TYPE") or _get("ACCELERATOR_TYPE") or ""


def notebook_place() -> str | None:
    """``"colab"`` or ``"kaggle"`` where their images say so (``COLAB_RELEASE_TAG``,
    ``KAGGLE_KERNEL_RUN_TYPE``), else None."""
    if _get("COLAB_RELEASE_TAG"):
        return "colab"
    if _get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    return None


def cuda_visible_devices() -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as set (None: unset, every GPU)."""
    return _get("CUDA_VISIBLE_DEVICES")


def pjrt_device() -> str | None:
    """torch_xla's ``PJRT_DEVICE`` (``TPU``, ``CPU``...)."""
    return _get("PJRT_DEVICE")


def tpu_topology_given() -> bool:
    """Whether ``TPU_NUM_DEVICES`` or ``TPU_PROCESS_BOUNDS`` already says which devices."""
    return _get("TPU_NUM_DEVICES") is not None or _get("TPU_PROCESS_BOUNDS") is not None


def secret_value() -> str | None:
    """``NOTEBOOK_ACCEL_SECRET``, the job's secret where it is given as a variable."""
    return _get(SECRET_VARIABLE)


def store_address() -> str:
    """``NOTEBOOK_ACCEL_STORE``: where a rank's env:// meets ("" outside a launch of ours)."""
    return _get(STORE_VARIABLE) or ""


def store_key() -> bytes:
    """``NOTEBOOK_ACCEL_STORE_KEY``: the key a rank proves to machine 0's table."""
    return bytes.fromhex(_get(STORE_KEY_VARIABLE) or "")


def gloo_interface() -> str | None:
    """``GLOO_SOCKET_IFNAME``, where the user (or a launch) chose gloo's interface."""
    return _get("GLOO_SOCKET_IFNAME")


def in_a_rank() -> bool:
    """Whether this process is a rank of a job (``RANK`` set: ours, torchrun's)."""
    return _get("RANK") is not None


def ray_usage_stats_set() -> bool:
    """Whether ``RAY_USAGE_STATS_ENABLED`` was set by the user."""
    return _get("RAY_USAGE_STATS_ENABLED") is not None


def set_var(name: str, value: str | None) -> None:
    """Set (or, with ``None``, remove) one variable in this process."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextmanager
def overridden(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set variables for the duration of a block, then put the old values back."""
    old = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            set_var(key, value)
        yield
    finally:
        for key, value in old.items():
            set_var(key, value)


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """accelerate's ``patch_environment``: each keyword, upper-cased, set to ``str(value)``
    for the block, then the old value back (or the variable removed).

    Example:
        >>> with patch_environment(my_flag=1):
        ...     get("MY_FLAG")
        '1'
        >>> get("MY_FLAG") is None
        True
    """
    with overridden({key.upper(): str(value) for key, value in kwargs.items()}):
        yield


# -- accelerate's environment helpers (accelerate.utils' names) ---------------------------
_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """accelerate's ``str_to_bool``: 1 for y/yes/t/true/on/1, 0 for n/no/f/false/off/0 (any
    case; ``True``/``False`` with ``to_bool``); ValueError for anything else.

    Example:
        >>> str_to_bool("Yes"), str_to_bool("off", to_bool=True)
        (1, False)
    """
    lowered = value.lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether variable ``key`` says true (``str_to_bool``'s words); ``default`` when unset."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """Variable ``key``'s value, ``default`` when unset."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first of ``env_keys`` that holds an int >= 0, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def config_file() -> Path:
    """The launch configuration file shared by the launcher, the panel and the command line.

    ``NOTEBOOK_ACCEL_CONFIG_FILE`` overrides it; otherwise it lives in the user's config folder
    (``$XDG_CONFIG_HOME`` or ``~/.config``).
    """
    explicit = os.environ.get(_PREFIX + "CONFIG_FILE")
    if explicit:
        return Path(explicit).expanduser()
    return _config_folder() / "notebook_accel" / "config.json"


def _config_folder() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config"))


def secret_file() -> Path:
    """Where the job's secret is kept when ``NOTEBOOK_ACCEL_SECRET`` is not set.

    Example:
        >>> secret_file().name
        'secret'
    """
    return _config_folder() / "notebook_accel" / "secret"


def durable_folder() -> Path:
    """Where this user's durable sessions keep their sockets and logs (a folder of mode 0700).

    ``NOTEBOOK_ACCEL_DURABLE_DIR`` overrides it; else ``$XDG_RUNTIME_DIR/notebook_accel``, else
    ``/tmp/notebook_accel-<uid>``.

    Example:
        >>> durable_folder().name.startswith("notebook_accel")  # doctest: +SKIP
        True
    """
    explicit = os.environ.get(_PREFIX + "DURABLE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "notebook_accel"
    return Path("/tmp") / f"notebook_accel-{os.getuid()}"


# -- variables derived from a launch, for user code (launched.Launch.variables) -----------
def launch_variables(**options: str) -> dict[str, str]:
    """``NOTEBOOK_ACCEL_*`` variables: what a rank's launch says, for user code to read.

    Example:
        >>> launch_variables(mixed_precision="bf16")
        {'NOTEBOOK_ACCEL_MIXED_PRECISION': 'bf16'}
    """
    return {_PREFIX + name.upper(): value for name, value in options.items()}
