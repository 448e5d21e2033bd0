"""Process state: where this process sits in the job, and the process group it belongs to.

    env.read_distributed()  ->  rank, local rank, world size   (our launcher, torchrun, SLURM,
    launched.current()      ->  device type, backend             or nothing: a single process)
                     |
                     v
    ProcessState.from_environment(cpu=...)
        world > 1 and no group yet -> torch.distributed.init_process_group(backend, "env://")
        world > 1 and a group      -> reuse it (a second Accelerator in the same process)

``ProcessView`` gives accelerate's names for those facts (process_index, is_main_process, ...),
once, to the Accelerator, PartialState and AcceleratorState. ``GradientState`` is the small
mutable record that the optimizer wrappers, the data loaders and ``Accelerator.accumulate``
share: whether this step synchronises gradients, and whether the active data loader is on
its last batch (and how many of that batch's samples are real); accelerate's
``GradientState()`` gives the latest Accelerator's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .. import devices, env, launched
from ..errors import ConfigError

__all__ = ["DistributedType", "GradientState", "ProcessState", "ProcessView"]


class DistributedType(str, enum.Enum):  # noqa: UP042 - accelerate's kind: str() as its
    """How the job is distributed; compares equal to accelerate's names (``"MULTI_CPU"``...)
    and prints as accelerate's (``str()``: ``"DistributedType.MULTI_CPU"``; the same kind of
    enum, a ``str`` mixed into ``Enum``).

    A process's state is NO, MULTI_CPU, MULTI_GPU, MULTI_TPU or XLA; an Accelerator's
    ``distributed_type`` is FSDP or DEEPSPEED under those strategies, as accelerate's. The
    other members are accelerate's, so that scripts comparing with them run (nothing here is
    ever of those kinds). ``MULTI_TPU`` is ours: TorchTPU's processes, one per chip, the
    name accelerate's own rule (``MULTI_`` and the device type) gives them (accelerate 1.16
    runs TorchTPU in one process only, and has no member for it).

    Example:
        >>> DistributedType.MULTI_CPU == "MULTI_CPU"
        True
        >>> str(DistributedType.MULTI_CPU)
        'DistributedType.MULTI_CPU'
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    XLA = "XLA"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_XPU = "MULTI_XPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    MULTI_TPU = "MULTI_TPU"


# One table instead of a ladder: device type -> (default backend, distributed type when world>1).
_DEVICE_KINDS: dict[str, tuple[str, DistributedType]] = {
    "cpu": ("gloo", DistributedType.MULTI_CPU),
    "cuda": ("nccl", DistributedType.MULTI_GPU),
    "mps": ("gloo", DistributedType.MULTI_CPU),
    "xla": ("xla", DistributedType.XLA),
    # TorchTPU: torch's PrivateUse1 device renamed "tpu", one process per chip, its group
    # the backend torch_tpu registers for "tpu" (devices.get_distributed_backend)
    "tpu": ("tpu_dist", DistributedType.MULTI_TPU),
}


def _auto_device_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    if devices.get_torch_accelerator_backend()[0] == "tpu":  # TorchTPU, as accelerate 1.16
        return "tpu"
    return "cpu"


def _device_for(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cuda":
        # One GPU per local rank; set_device also makes NCCL pick the right card.
        index = local_rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device_type == "tpu":
        # TorchTPU assigns each process its chip (torch.tpu.set_device only checks it).
        return torch.device("tpu", torch.get_device_module("tpu").current_device())
    if device_type == "xla":
        import torch_xla

        return torch.device(torch_xla.device())
    return torch.device(device_type)


@dataclass(frozen=True)
class ProcessState:
    """This process's rank, world, device and backend: the one record of them, built once
    per Accelerator (or PartialState). accelerate's names for them are ``ProcessView``'s.

    Attributes:
        rank: global rank (0 in a single process).
        local_rank: rank on this machine.
        world_size: number of processes in the job.
        local_world_size: number of processes on this machine.
        device: the device this process trains on.
        backend: the torch.distributed backend (``"gloo"``, ``"nccl"``, ``"xla"``).
        distributed_type: ``DistributedType.NO`` for a single process.
        created_group: whether this state initialised the default process group.

    Example:
        >>> state = ProcessState.from_environment(cpu=True)
        >>> state.world_size, state.device.type
        (1, 'cpu')
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    distributed_type: DistributedType
    created_group: bool = False

    @classmethod
    def from_environment(
        cls, cpu: bool = False, group_options: dict[str, Any] | None = None
    ) -> ProcessState:
        """Read the job's variables, pick the device and join the process group if needed.

        ``group_options`` (``InitProcessGroupKwargs``): ``backend``, ``init_method`` and
        ``timeout`` for ``init_process_group`` when this call creates the group.
        """
        options = dict(group_options or {})
        launch = launched.current()
        device_type = "cpu" if cpu else (launched.device_type() or _auto_device_type())
        job = _xla_job() if device_type == "xla" else env.read_distributed()
        default_backend, multi_type = _DEVICE_KINDS[device_type]
        # cpu=True must win over a launcher that chose CUDA: NCCL cannot move CPU tensors.
        backend = default_backend if cpu or launch is None else launch.backend
        backend = options.pop("backend", None) or backend
        device = _device_for(device_type, job.local_rank)
        created = _join_group(backend, job, options) if job.world_size > 1 else False
        return cls(
            rank=job.rank,
            local_rank=job.local_rank,
            world_size=job.world_size,
            local_world_size=job.local_world_size,
            device=device,
            backend=backend,
            distributed_type=multi_type if job.world_size > 1 else DistributedType.NO,
            created_group=created,
        )

    @property
    def has_group(self) -> bool:
        """Whether a torch.distributed process group joins the ranks.

        Not where one process drives several XLA devices from threads (TPU v2/v3, torch_xla's
        CPU runtime): there the ranks meet through torch_xla's own collectives.
        """
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        """Wait until every process gets here (a no-op in a single process)."""
        if self.has_group:
            dist.barrier()
        elif self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.rendezvous("notebook_accel.barrier")


class ProcessView:
    """accelerate's names for a process's facts, said once: the Accelerator, PartialState
    and AcceleratorState (and ``accelerator.state``) answer them from their ``_process``.

    Example:
        >>> from notebook_accel.state import PartialState
        >>> PartialState().is_last_process
        True
    """

    _process: ProcessState

    @property
    def device(self) -> torch.device:
        """The device this process uses."""
        return self._process.device

    @property
    def process_index(self) -> int:
        """Global rank."""
        return self._process.rank

    @property
    def local_process_index(self) -> int:
        """Rank on this machine."""
        return self._process.local_rank

    @property
    def num_processes(self) -> int:
        """Processes in the job."""
        return self._process.world_size

    @property
    def use_distributed(self) -> bool:
        """More than one process."""
        return self._process.world_size > 1

    @property
    def is_main_process(self) -> bool:
        """Global rank 0."""
        return self._process.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """Rank 0 of this machine."""
        return self._process.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        """The highest global rank."""
        return self._process.rank == self._process.world_size - 1

    @property
    def distributed_type(self) -> DistributedType:
        """``DistributedType.NO`` in a single process, else ``MULTI_CPU``/``MULTI_GPU``/``XLA``
        (an Accelerator's: FSDP or DEEPSPEED under those strategies)."""
        return self._process.distributed_type


def _xla_job() -> env.DistributedEnv:
    """Rank and world from torch_xla, not the environment.

    torch_xla's launch sets no RANK/WORLD_SIZE, and where one process drives several devices
    (a thread each: TPU v2/v3, the CPU runtime) the environment is shared by those threads;
    torch_xla knows each thread's ordinal.
    """
    import torch_xla.runtime as xr

    return env.DistributedEnv(
        rank=xr.global_ordinal(),
        local_rank=xr.local_ordinal(),
        world_size=xr.world_size(),
        local_world_size=xr.local_device_count(),
        master_addr=None,
        master_port=None,
    )


def _join_group(
    backend: str, job: env.DistributedEnv, options: dict[str, Any] | None = None
) -> bool:
    """Join (or reuse) the default process group; True when this call created it."""
    if backend == "xla":
        return _join_xla_group()
    if dist.is_initialized():
        if dist.get_world_size() != job.world_size:
            raise ConfigError(
                "WORLD_SIZE",
                job.world_size,
                f"the size of the existing process group ({dist.get_world_size()})",
            )
        return False
    options = dict(options or {})
    init_method = options.pop("init_method", None) or "env://"
    if init_method == "env://" and (job.master_addr is None or job.master_port is None):
        raise ConfigError(
            "MASTER_ADDR/MASTER_PORT",
            (job.master_addr, job.master_port),
            "an address and a port when WORLD_SIZE > 1",
            "Start the function with notebook_launcher(), torchrun, or set both variables.",
        )
    # Rank and world are passed explicitly so SLURM-style jobs (no RANK variable) work too;
    # env:// still reads MASTER_ADDR/PORT and, under our launcher, uses the parent's store.
    dist.init_process_group(
        backend, init_method=init_method, rank=job.rank, world_size=job.world_size, **options
    )
    return True


def _join_xla_group() -> bool:
    """The ``xla`` process group, where each process drives one device (TPU v4 and later).

    torch.distributed has one default group per process, so a process that drives several
    devices from threads cannot give each its own rank; collectives.py then uses torch_xla's
    own collectives instead.
    """
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)
    import torch_xla.runtime as xr

    if dist.is_initialized() or xr.addressable_device_count() > 1:
        return False
    # xla:// takes rank, world and the coordinator from torch_xla's runtime.
    dist.init_process_group("xla", init_method="xla://")
    return True


class GradientState:
    """One Accelerator's gradient state: the small mutable record that the optimizer
    wrappers, the data loaders and ``Accelerator.accumulate`` share, and accelerate's
    ``GradientState()`` too.

    ``GradientState(accumulation_steps=N)`` makes a record (an Accelerator makes its own:
    ``for_accelerator``). accelerate's ``GradientState()`` (or with its
    ``gradient_accumulation_plugin``) gives the latest Accelerator's record of this process,
    live, as accelerate's shared one does; before any Accelerator, a fresh one (``num_steps``
    from the plugin, else 1).

    Attributes:
        accumulation_steps: micro-batches per optimizer step (accelerate's ``num_steps``).
        sync_gradients: whether the current micro-batch ends an accumulation cycle.
        micro_step: micro-batches seen in the current cycle.
        end_of_dataloader: the active loader just yielded its last batch.
        remainder: on the last batch, how many of the gathered samples are real (-1: all).

    Example:
        >>> GradientState(accumulation_steps=2).sync_gradients
        True
    """

    _latest: ClassVar[GradientState | None] = None

    def __new__(
        cls, gradient_accumulation_plugin: Any = None, *, accumulation_steps: int | None = None
    ) -> GradientState:
        if accumulation_steps is None and cls._latest is not None:
            return cls._latest  # accelerate's GradientState(): the latest Accelerator's
        return super().__new__(cls)

    def __init__(
        self, gradient_accumulation_plugin: Any = None, *, accumulation_steps: int | None = None
    ) -> None:
        if self is GradientState._latest and accumulation_steps is None:
            return  # the latest Accelerator's record, as it is
        plugin_steps = getattr(gradient_accumulation_plugin, "num_steps", None)
        self.accumulation_steps = accumulation_steps or plugin_steps or 1
        self.sync_gradients = True
        self.micro_step = 0
        self.end_of_dataloader = False
        self.remainder = -1

    @classmethod
    def for_accelerator(cls, accumulation_steps: int) -> GradientState:
        """A new Accelerator's record, which ``GradientState()`` then gives."""
        record = cls(accumulation_steps=accumulation_steps)
        cls._latest = record
        return record

    def advance(self) -> None:
        """Start a micro-batch: decide whether it synchronises (cycle end or loader end)."""
        self.micro_step += 1
        if self.end_of_dataloader or self.micro_step >= self.accumulation_steps:
            self.sync_gradients = True
            self.micro_step = 0
        else:
            self.sync_gradients = False

    # accelerate's names
    num_steps = property(lambda self: self.accumulation_steps, doc="Accumulation steps.")
    adjust_scheduler = property(lambda self: False, doc="accelerate's answer for its plugins.")
    sync_with_dataloader = property(lambda self: True, doc="A loader's end ends a cycle.")
    initialized = property(lambda self: True, doc="True: a GradientState exists.")

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {{'num_steps': {self.num_steps}}}\n"
        )


@launched.forget_when_a_rank_starts
def _forget_gradients() -> None:
    """A new rank has no Accelerator yet: GradientState() is a fresh record there."""
    GradientState._latest = None
