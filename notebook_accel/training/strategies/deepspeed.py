"""DeepSpeed's ZeRO (stages 0-3) as a strategy; the ``deepspeed`` package is an optional extra.

prepare(model, optimizer, loader) in one call (as accelerate requires):
    __init__            -> imports deepspeed (as accelerate's state does), binds the Accelerator's
                       settings to the plugin (its ZeRO-3 init context's config); on CPU,
                       glibc returns freed blocks (fsdp.return_freed_memory)
    begin_prepare   -> remembers the call's optimizers and the loader's batch size
    prepare_model   -> deepspeed.initialize(model, the user's torch optimizer,
                       plugin.ds_config(...) with "auto" filled, ZeRO's sizes from the
                       model's hidden size) -> DeepSpeedEngine (a model built in the
                       plugin's zero3_init_context_manager arrives partitioned)
    wrap_optimizer  -> DeepSpeedOptimizer: step/zero_grad are the engine's (no-ops here)
backward(loss)      -> engine.backward (DeepSpeed divides by the accumulation steps),
                       then engine.step, told where the accumulation boundary is
clipping            -> DeepSpeed clips in its step (``gradient_clipping``); the facade's
                       clip_grad_norm_ returns the engine's global norm
state dict          -> the whole module (ZeRO-3's partitions gathered: every rank calls)
checkpoints         -> engine.save_checkpoint / load_checkpoint inside our staging folder;
                       its files read with weights_only=True (DeepSpeed's own load passes
                       False), DeepSpeed's few classes allowed, unless the user trusts them
end                 -> destroys the single-process group __init__ made (end_training)
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ... import refusals
from ...errors import CheckpointError, ConfigError
from ...options import rules
from ...options.deepspeed import DeepSpeedPlugin
from ..checkpoint.files import untrusted
from ..checkpoint.folder import Stateful, find
from ..precision.modes import Precision
from ..precision.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from ..process import DistributedType, GradientState, ProcessState
from .base import CheckpointPart, Strategy
from .dummies import DummyOptim, DummyScheduler, parameters_of

__all__ = [
    "DeepSpeedStrategy",
    "DeepSpeedOptimizer",
    "CHECKPOINT_TAG",
]

# accelerate saves DeepSpeed's checkpoint under this tag in the checkpoint folder.
CHECKPOINT_TAG = "pytorch_model"


def _engine_type() -> type:
    from deepspeed import DeepSpeedEngine

    return DeepSpeedEngine


class DeepSpeedOptimizer(AcceleratedOptimizer):
    """The prepared optimizer under DeepSpeed: the engine steps and zeroes in ``backward``.

    ``optimizer`` is the user's torch optimizer (its ``param_groups`` drive the LR
    schedulers); ``engine.optimizer`` is DeepSpeed's ZeRO optimizer around it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        engine: Any,
        gradients: GradientState,
        source: Any = None,
    ) -> None:
        self.optimizer = optimizer
        self.engine = engine
        self.gradients = gradients
        self.step_was_skipped = False
        self.source = optimizer if source is None else source  # what the user prepared

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """A no-op: the engine stepped in ``accelerator.backward``."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """A no-op: the engine zeroes gradients after its step."""

    def state_dict(self) -> dict[str, Any]:
        """DeepSpeed's optimizer state (this rank's partition under ZeRO)."""
        return self.engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load this rank's partition of DeepSpeed's optimizer state."""
        self.engine.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizer({self.optimizer!r})"


class EngineScheduler(AcceleratedScheduler):
    """The prepared ``DummyScheduler``: the scheduler DeepSpeed built, stepped by the engine
    at each optimizer step (in ``accelerator.backward``); ``step()`` is a no-op."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """A no-op: the engine stepped its scheduler in ``accelerator.backward``."""


class DeepSpeedPart:
    """The engine's checkpoint (model, ZeRO optimizer partitions) inside our atomic save."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def save(self, folder: Path) -> None:
        """Every rank writes its part under ``folder/pytorch_model`` (a collective)."""
        self.engine.save_checkpoint(os.fspath(folder), tag=CHECKPOINT_TAG)

    def load(self, folder: Path, trusted: bool = False) -> None:
        """Every rank reads its part; the partitions are re-cut to this job's size.

        Raises:
            CheckpointError: the folder holds no DeepSpeed checkpoint, or a file of it needs
                full unpickling and ``trusted`` is off.
        """
        if not (folder / CHECKPOINT_TAG).is_dir():
            raise CheckpointError(folder / CHECKPOINT_TAG, "missing: not saved with DeepSpeed")
        with contextlib.ExitStack() as stack:
            if not trusted:
                stack.enter_context(_weights_only(self.engine.checkpoint_engine))
            path, _ = self.engine.load_checkpoint(os.fspath(folder), tag=CHECKPOINT_TAG)
        if path is None:
            raise CheckpointError(folder / CHECKPOINT_TAG, "DeepSpeed could not load it")


@contextlib.contextmanager
def _weights_only(checkpoint_engine: Any) -> Iterator[None]:
    """DeepSpeed's checkpoint engine reading with ``weights_only=True`` for a while.

    Its torch engine loads with ``weights_only=False``; its files hold tensors, plain data and
    these few classes of DeepSpeed's (found in ZeRO 0-3 checkpoints, fp32 and bf16).
    """
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    allowed = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]

    def load(path: str, map_location: Any = None) -> Any:
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            raise untrusted(path, err) from None

    checkpoint_engine.load = load  # shadows the method on this instance only
    try:
        yield
    finally:
        del checkpoint_engine.load


class DeepSpeedStrategy(Strategy):
    """ZeRO data parallelism through a DeepSpeed engine (one trained model per Accelerator).

    Args:
        state: the job's process facts (its process group is DeepSpeed's too).
        plugin: the user's :class:`~notebook_accel.DeepSpeedPlugin`.
        gradient_state: the Accelerator's accumulation counters.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` (DeepSpeed's own config).
        split_batches: loaders' batch sizes are global (divided by the processes).

    Raises:
        ConfigError: the ``deepspeed`` package is missing.
    """

    name = "deepspeed"

    @property
    def distributed_type(self) -> DistributedType:
        """DEEPSPEED, as accelerate's Accelerator reports it (in one process too)."""
        return DistributedType.DEEPSPEED

    def __init__(
        self,
        state: ProcessState,
        plugin: DeepSpeedPlugin,
        gradient_state: GradientState,
        mixed_precision: str,
        split_batches: bool = False,
    ) -> None:
        rules.deepspeed_precision(mixed_precision, state.device.type)
        if plugin.offloads_to_nvme and not _nvme_offload_built():
            where = "DeepSpeedPlugin(offload_*_device='nvme')"
            raise refusals.refuse(where, refusals.NVME_OFFLOAD)
        super().__init__(state)
        self.created_group = False
        if not torch.distributed.is_initialized():
            # DeepSpeed needs a process group even alone (accelerate runs it on one process):
            # a group of one over an in-memory store, nothing to rendezvous with.
            torch.distributed.init_process_group(
                state.backend, store=torch.distributed.HashStore(), rank=0, world_size=1
            )
            self.created_group = True
        if state.device.type == "cpu":
            from .sharder import return_freed_memory

            # ZeRO frees gathered layers and its buckets each step: on glibc's heap they
            # stayed resident (ZeRO-3's peak grew step after step on the benchmark's model).
            return_freed_memory("DeepSpeed")
        import deepspeed  # noqa: F401  (after: it may allocate; part of setup, as in accelerate)

        plugin._settings = {
            "accumulation_steps": gradient_state.accumulation_steps,
            "mixed_precision": mixed_precision,
            "micro_batch_size": None,
            "world_size": state.world_size,
            "device_type": state.device.type,
        }
        self._transformers_view: TransformersView | None = None
        if plugin.zero_stage == 3 and importlib.util.find_spec("transformers") is not None:
            from transformers.integrations import set_hf_deepspeed_config

            # As accelerate does: transformers builds its models partitioned while the
            # plugin's zero3_init_flag is on. It keeps a weak reference: we hold the view.
            self._transformers_view = TransformersView(plugin)
            set_hf_deepspeed_config(self._transformers_view)
        self.plugin = plugin
        self.gradient_state = gradient_state
        self.mixed_precision = mixed_precision
        self.split_batches = split_batches
        self.engine: Any = None
        self._call_optimizers: list[Any] = []  # torch optimizers and DummyOptims
        self._call_schedulers: list[Any] = []
        self._micro_batch: int | None = None
        self._engine_of: dict[int, Any] = {}  # id(user optimizer) -> engine

    # ---- prepare ---------------------------------------------------------------------------
    def begin_prepare(self, objects: Iterable[Any]) -> None:
        """Note the call's optimizers (each goes into its model's engine) and batch size."""
        objects = list(objects)
        self._call_optimizers = [
            o for o in objects if isinstance(o, torch.optim.Optimizer | DummyOptim)
        ]
        self._call_schedulers = [
            o
            for o in objects
            if isinstance(o, DummyScheduler | torch.optim.lr_scheduler.LRScheduler)
        ]
        sizes = []
        for obj in objects:
            if isinstance(obj, DataLoader):
                size = obj.batch_size or getattr(obj.batch_sampler, "batch_size", None)
                if size and self.split_batches:
                    size = max(size // self.state.world_size, 1)
                if size:
                    sizes.append(size)
        if sizes and self._micro_batch is None:
            # accelerate's rule with a train and an eval loader in one call: the smaller
            # batch, or with is_train_batch_min=False the larger.
            self._micro_batch = min(sizes) if self.plugin.is_train_batch_min else max(sizes)

    def is_prepared(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is a DeepSpeed engine."""
        return isinstance(model, _engine_type())

    @property
    def keeps_parameters(self) -> bool:
        """False: DeepSpeed takes the optimizer together with its model."""
        return False

    @property
    def scales_loss(self) -> bool:
        """True: the engine divides the loss by its accumulation steps."""
        return True

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``deepspeed.initialize`` with the optimizer of the same prepare call that steps
        this model's parameters (none: an engine for inference).

        Raises:
            ConfigError: a second trained model (accelerate allows one per plugin).
        """
        import deepspeed

        own = {id(p) for p in model.parameters()}
        optimizer = next(
            (o for o in self._call_optimizers if any(id(p) in own for p in parameters_of(o))),
            None,
        )
        if optimizer is not None and self.engine is not None:
            raise ConfigError(
                "prepare(model, optimizer)",
                "a second trained model",
                "one model with an optimizer per Accelerator under DeepSpeed",
            )
        scheduler = next(
            (
                s
                for s in self._call_schedulers
                if optimizer is not None and s.optimizer is optimizer
            ),
            None,
        )
        _moe_leaves(model, self.plugin.moe_classes())
        fill, extra = self._sections(optimizer, scheduler)
        config = self.plugin.ds_config(
            accumulation_steps=self.gradient_state.accumulation_steps,
            mixed_precision=self.mixed_precision,
            micro_batch_size=self._micro_batch,
            world_size=self.state.world_size,
            hidden_size=hidden_size(model),
            device_type=self.state.device.type,
            fill=fill,
        )
        engine, _, _, _ = deepspeed.initialize(
            model=model, config=config, dist_init_required=False, **extra
        )
        if optimizer is not None:
            self.engine = engine
            self._engine_of[id(optimizer)] = engine
        return engine

    def _sections(self, optimizer: Any, scheduler: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """What the config's ``optimizer``/``scheduler`` sections take from the dummies (the
        ``"auto"`` values), and ``deepspeed.initialize``'s optimizer arguments.

        Raises:
            ConfigError: a section and a torch object for it at once, or a dummy without its
                section (accelerate's rules).
        """
        config = self.plugin.config
        sections = "optimizer" in config, "scheduler" in config
        dummy_optim = isinstance(optimizer, DummyOptim)
        dummy_sched = isinstance(scheduler, DummyScheduler)
        if optimizer is not None and sections[0] != dummy_optim:
            raise ConfigError(
                "prepare(optimizer)",
                type(optimizer).__name__,
                "a DummyOptim for the config's optimizer section"
                if sections[0]
                else "a torch optimizer (a DummyOptim needs an optimizer section in the config)",
            )
        if scheduler is not None and dummy_optim and not dummy_sched:
            raise ConfigError(
                "prepare(scheduler)", type(scheduler).__name__, "a DummyScheduler with DummyOptim"
            )
        if scheduler is not None and sections[1] and not dummy_sched:
            raise ConfigError(
                "prepare(scheduler)",
                type(scheduler).__name__,
                "a DummyScheduler for the config's scheduler section",
            )
        if dummy_sched and not sections[1] and scheduler.lr_scheduler_callable is None:
            raise ConfigError(
                "prepare(scheduler)",
                "DummyScheduler without lr_scheduler_callable",
                "a scheduler section in the config, or DummyScheduler(lr_scheduler_callable=)",
            )
        if not dummy_optim:
            return {}, {"optimizer": optimizer}
        fill: dict[str, Any] = {
            "optimizer.params.lr": optimizer.lr,
            "optimizer.params.weight_decay": optimizer.weight_decay,
        }
        extra: dict[str, Any] = {"model_parameters": optimizer.params}
        if dummy_sched and scheduler.lr_scheduler_callable is not None:
            extra["lr_scheduler"] = scheduler.lr_scheduler_callable
        elif dummy_sched:
            fill["scheduler.params.warmup_min_lr"] = 0
            fill["scheduler.params.warmup_max_lr"] = optimizer.lr
            fill["scheduler.params.warmup_num_steps"] = scheduler.warmup_num_steps
            if scheduler.total_num_steps is not None:
                total = scheduler.total_num_steps
                per_process = total if self.split_batches else -(-total // self.state.world_size)
                fill["scheduler.params.total_num_steps"] = per_process
        return fill, extra

    def wrap_scheduler(
        self, scheduler: Any, optimizers: list[AcceleratedOptimizer], **options: Any
    ) -> AcceleratedScheduler:
        """A DummyScheduler becomes the engine's scheduler; a torch one steps as elsewhere."""
        if not isinstance(scheduler, DummyScheduler):
            return super().wrap_scheduler(scheduler, optimizers, **options)
        engine = self._engine_of.get(id(scheduler.optimizer))
        if engine is None or engine.lr_scheduler is None:
            raise ConfigError(
                "prepare(DummyScheduler)",
                "no scheduler built",
                "a DummyScheduler prepared in the same prepare() call as its DummyOptim",
            )
        return EngineScheduler(engine.lr_scheduler, optimizers, **options)

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, precision: Precision, gradients: GradientState
    ) -> AcceleratedOptimizer:
        """A :class:`DeepSpeedOptimizer` over the engine that took ``optimizer`` (for a
        DummyOptim: over the torch optimizer DeepSpeed built from the config).

        Raises:
            ConfigError: the optimizer's model was not prepared in the same call.
        """
        engine = self._engine_of.get(id(optimizer))
        if engine is None:
            raise ConfigError(
                "prepare(optimizer)",
                type(optimizer).__name__,
                "an optimizer prepared in the same prepare() call as its model (DeepSpeed "
                "builds both together)",
            )
        if isinstance(optimizer, DummyOptim):
            return DeepSpeedOptimizer(engine.basic_optimizer, engine, gradients, source=optimizer)
        return DeepSpeedOptimizer(optimizer, engine, gradients)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside the engine."""
        inner = model.module if self.is_prepared(model) else model
        assert isinstance(inner, torch.nn.Module)
        return inner

    # ---- training step ---------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, precision: Precision, **kwargs: Any) -> None:
        """The engine's backward (it divides by the accumulation steps), then its step,
        which only updates at the accumulation boundary the Accelerator decided."""
        if self.engine is None:
            raise ConfigError(
                "backward()", "no DeepSpeed engine", "prepare(model, optimizer) first"
            )
        sync = self.gradient_state.sync_gradients
        self.engine.set_gradient_accumulation_boundary(sync)
        self.engine.backward(loss, **kwargs)
        self.engine.step()

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Nothing to do: the engine reduces gradients at the accumulation boundary only."""
        yield

    def grad_norm(self, grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
        """The global norm the engine computed in its last step (0 before any)."""
        norm = None if self.engine is None else self.engine.get_global_grad_norm()
        if norm is None:
            return torch.tensor(0.0)
        return norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """DeepSpeed clips in its step by the plugin's ``gradient_clipping`` (as under
        accelerate); this returns the norm it measured."""
        return self.grad_norm([], norm_type)

    # ---- state ------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole state dict of the user's module; ZeRO-3 gathers it (every rank calls)
        and only the main process gets it (``{}`` elsewhere)."""
        module = self.unwrap(model)
        if not self.is_prepared(model):
            return module.state_dict()
        import deepspeed

        # ZeRO keeps parameters as views of one flat buffer (stages 1-2) or as partitions
        # (stage 3): gather them, and copy each out, or a writer sees one shared storage.
        gather = self.plugin.zero_stage == 3
        params = list(module.parameters()) if gather else []
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=gather):
            if gather and self.state.rank != 0:
                return {}
            return {k: v.detach().clone().cpu() for k, v in module.state_dict().items()}

    def checkpoint_parts(
        self, objects: Stateful, directory: str | os.PathLike[str] | None = None
    ) -> tuple[Stateful, CheckpointPart | None]:
        """The engine's model and optimizer go through DeepSpeed's own checkpoint.

        Raises:
            CheckpointError: loading a checkpoint that has no DeepSpeed part.
        """
        if self.engine is None:
            return objects, None
        if directory is not None and not (find(directory) / CHECKPOINT_TAG).is_dir():
            raise CheckpointError(
                find(directory) / CHECKPOINT_TAG,
                "missing: the checkpoint was not saved with DeepSpeed",
            )
        rest = replace(
            objects,
            model=[m for m in objects.model if m is not self.engine],
            optimizer=[o for o in objects.optimizer if not isinstance(o, DeepSpeedOptimizer)],
        )
        return rest, DeepSpeedPart(self.engine)

    # ---- end --------------------------------------------------------------------------------
    def end(self) -> None:
        """Destroy the group of one made for DeepSpeed alone (a later Accelerator, or a
        plain torch.distributed job in the same process, starts clean)."""
        if self.created_group or self.state.created_group:  # the group goes away now
            from deepspeed.utils import groups

            # DeepSpeed caches a clone of the world group for its collectives (groups.py,
            # _clone_world_group) and never drops it: the next engine would use the
            # destroyed group ("Group ... is not registered").
            groups._WORLD_GROUP = None
        if self.created_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        self.created_group = False
        if self._transformers_view is not None:
            from transformers.integrations import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            self._transformers_view = None


def _nvme_offload_built() -> bool:
    """Whether DeepSpeed can offload to NVMe here: its async_io op is built or buildable."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return bool(AsyncIOBuilder().is_compatible(verbose=False))


def _moe_leaves(model: torch.nn.Module, names: list[str]) -> None:
    """ZeRO-3 gathers each mixture-of-experts block as one leaf (accelerate's
    ``set_moe_leaf_modules``): the classes of ``model`` called ``names``.

    Raises:
        ConfigError: a name that is no class of the model's modules.
    """
    if not names:
        return
    from deepspeed.utils import set_z3_leaf_modules

    classes = {type(m).__name__: type(m) for m in model.modules()}
    unknown = [name for name in names if name not in classes]
    if unknown:
        raise ConfigError(
            "DeepSpeedPlugin.transformer_moe_cls_names",
            unknown[0],
            "the class name of one of the model's modules",
        )
    set_z3_leaf_modules(model, [classes[name] for name in names])


class TransformersView:
    """What transformers asks of the DeepSpeed config it is told about (``is_zero3()``,
    ``config``), answered live from a plugin: while ``zero3_init_flag`` is on (at stage 3),
    transformers' ``from_pretrained``/``from_config`` build the model partitioned, as under
    accelerate; ``zero3_init_context_manager(enable=False)`` turns that off in its block.

    Example:
        >>> from notebook_accel import DeepSpeedPlugin
        >>> TransformersView(DeepSpeedPlugin(zero_stage=3)).is_zero3()
        True
    """

    def __init__(self, plugin: DeepSpeedPlugin) -> None:
        self.plugin = plugin

    def is_zero3(self) -> bool:
        """Whether transformers should build models partitioned now."""
        return self.plugin.zero_stage == 3 and self.plugin.is_zero3_init_enabled()

    @property
    def config(self) -> dict[str, Any]:
        """The config transformers opens ``deepspeed.zero.Init`` with."""
        return self.plugin.init_config()


def hidden_size(model: Any) -> int:
    """The size ZeRO's ``"auto"`` buckets follow: a transformers model's ``hidden_size``
    (the largest of ``hidden_sizes``), else the square root of its largest parameter's size
    (its whole size: ``ds_numel`` when ZeRO-3 already partitioned it)."""
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "hidden_size", None), int):
        return int(config.hidden_size)  # type: ignore[union-attr]
    sizes = getattr(config, "hidden_sizes", None)
    if sizes:
        return int(max(sizes))
    largest = max((getattr(p, "ds_numel", p.numel()) for p in model.parameters()), default=1)
    return max(math.isqrt(int(largest)), 1)
