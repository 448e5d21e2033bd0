"""Accelerator: the thin facade a training function talks to, with accelerate's names.

Its options are settled by ``choices.py`` (the launcher's defaults, accelerate's spellings,
the rules of combination), which also builds its process state, precision and strategy. Each
call is then delegated: process facts to ``state``/``processes``, precision to ``precision``,
the spreading of models to the strategy (``strategies/``), data to ``data``, collectives to
``collectives``, checkpoints to ``checkpoint``, logging to ``tracking``. This module keeps the
prepared objects, the shared ``GradientState``, the step count and the hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader
from torch.utils.hooks import RemovableHandle

from .. import env, launched
from ..big_model.tensors import move_keeping_ties
from ..errors import CheckpointError, ConfigError
from ..options.deepspeed import DeepSpeedPlugin
from ..options.dynamo import DynamoBackend, TorchDynamoPlugin
from ..options.fsdp import FsdpConfig
from ..options.parallelism import ParallelismConfig
from ..reporting import live
from ..seeding import set_seed
from . import accelerator_state, collectives, trackers
from . import compile as compiling
from .checkpoint import files as checkpoint_files
from .checkpoint import folder as checkpoint
from .choices import OPTIONS, accumulation_steps, settle
from .data.config import DataLoaderConfiguration
from .data.loader import DataLoaderShard, skip_first_batches
from .data.rng import synchronize_rng_states
from .data.sharding import shard_data_loader
from .handlers import (
    AutocastKwargs,
    GradientAccumulationPlugin,
    HandlerView,
    KwargsHandler,
)
from .logs import MultiProcessAdapter
from .memory import release_memory
from .precision.modes import AutocastForward, MixedPrecision
from .precision.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from .process import DistributedType, GradientState, ProcessView
from .profiling import ProfileKwargs, profiled
from .project import ProjectConfiguration
from .strategies.dummies import DummyOptim, DummyScheduler

__all__ = ["Accelerator", "DistributedType", "shards_parameters"]

F = TypeVar("F", bound=Callable[..., Any])
# accelerate's module logger: main process only, "[RANK 0] " first (no levels set here)
_logger = MultiProcessAdapter(logging.getLogger(__name__), {})
_Params = torch.Tensor | Iterable[torch.Tensor]


class Accelerator(ProcessView, HandlerView):
    """Device placement, data parallelism, mixed precision, accumulation and checkpoints.

    Args:
        device_placement: move prepared models and every batch to :attr:`device`.
        split_batches: a loader's batch size is the global one, cut across processes
            (default: every process gets the loader's batch size); also settable in
            ``dataloader_config``.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (torchao float8 on GPUs
            with compute capability >= 8.9, options in ``AORecipeKwargs``); ``None`` takes
            the launcher's.
        gradient_accumulation_steps: micro-batches per optimizer step; ``None`` takes the
            launcher's (1 outside a launch).
        cpu: train on the CPU even where a GPU exists.
        even_batches: pad the end of each epoch so every process gets as many batches
            (default True); also settable in ``dataloader_config``.
        ddp_kwargs: extra keyword arguments for ``DistributedDataParallel`` (with those of a
            ``DistributedDataParallelKwargs`` handler; the same key in both is refused).
        fsdp: shard models with FSDP instead of DDP: an :class:`~notebook_accel.FsdpConfig`,
            a dict of its fields or a strategy name; ``None`` takes the launcher's (off).
        fsdp_plugin: accelerate's name for ``fsdp``: a
            ``FullyShardedDataParallelPlugin(...)`` (an FsdpConfig made from accelerate's
            fields); not with ``fsdp``.
        project_dir: where checkpoints and logs go (sets ``project_config.project_dir``).
        project_config: a :class:`~notebook_accel.ProjectConfiguration`.
        kwargs_handlers: option carriers for components, one of each kind:
            ``DistributedDataParallelKwargs``, ``GradScalerKwargs``, ``InitProcessGroupKwargs``,
            ``ProfileKwargs`` (:meth:`profile`'s); see :mod:`notebook_accel.training.handlers`.
        dataloader_config: a :class:`~notebook_accel.DataLoaderConfiguration`
            (how loaders are sharded: split, dispatch, even batches, seedable sampler...).
        step_scheduler_with_optimizer: a prepared LR scheduler steps only with its optimizer,
            ``num_processes`` times per optimizer step (once with ``split_batches``), as
            accelerate does; ``False``: every ``scheduler.step()`` call steps it once.
        rng_types: generators made equal to rank 0's at the start of each iteration of a
            prepared loader: ``"torch"``, ``"cuda"``, ``"xla"``; ``"generator"`` (the default)
            is the shuffle's, which every rank seeds alike in any case.
        log_with: experiment trackers for :meth:`log`: ``"tensorboard"``, ``"mlflow"``,
            ``"wandb"``, ``"trackio"``, ``"all"`` (every one installed), a list of them, or
            :class:`~notebook_accel.training.trackers.GeneralTracker` instances.
        deepspeed_plugin: train with DeepSpeed's ZeRO: a
            :class:`~notebook_accel.DeepSpeedPlugin` (needs the ``deepspeed``
            extra; not with ``fsdp``); ``None`` takes the launcher's (off). Prepare each model
            with its optimizer in one ``prepare`` call.
        parallelism_config: a :class:`~notebook_accel.ParallelismConfig`
            (accelerate's mesh sizes): tensor parallelism alone, or FSDP/HSDP by
            ``dp_shard_size``/``dp_replicate_size``; not with ``fsdp`` or DeepSpeed.
        dynamo_backend: compile prepared models with ``torch.compile`` on this backend
            (``"inductor"``, ``"aot_eager"``...; see :class:`~notebook_accel.DynamoBackend`);
            ``None`` takes the launcher's (``"no"``: eager). Not with ``dynamo_plugin``.
        dynamo_plugin: a :class:`~notebook_accel.TorchDynamoPlugin` (mode, fullgraph,
            dynamic, options, regional compilation). Models are compiled after their DDP
            wrapper, as accelerate does; DDP and single-process training only.
        gradient_accumulation_plugin: accelerate's carrier of the accumulation steps
            (``GradientAccumulationPlugin(num_steps=...)``); not with
            ``gradient_accumulation_steps``.
        torch_tp_plugin: accelerate's deprecated ``TorchTensorParallelPlugin(tp_size=N)``:
            ``parallelism_config=ParallelismConfig(tp_size=N)`` where none is given (a
            FutureWarning, as accelerate's).
        megatron_lm_plugin: accepted for accelerate's signature; a plugin is refused
            (Megatron-LM is not supported).
        deepspeed_plugins: accelerate's other spelling of ``deepspeed_plugin``: a plugin, or
            a dict of one named plugin (several, switched between, are not built).

    Arguments after ``parallelism_config`` are accelerate's order exactly, so a positional
    call binds as it would there; ``even_batches``, ``ddp_kwargs`` and ``fsdp`` are ours and
    keyword-only.

    Example:
        >>> accelerator = Accelerator()
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        >>> for x, y in loader:
        ...     loss = torch.nn.functional.mse_loss(model(x), y)
        ...     accelerator.backward(loss)
        ...     optimizer.step()
        ...     optimizer.zero_grad()
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: MixedPrecision | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FsdpConfig | None = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        parallelism_config: ParallelismConfig | None = None,
        *,
        even_batches: bool | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
        fsdp: FsdpConfig | dict[str, Any] | str | None = None,
    ) -> None:
        # Every option settled (and refused) before joining a process group, and the parts
        # built from them (training/choices.py: the launcher's defaults, accelerate's other
        # spellings, options/rules.py's combinations): errors come out clean.
        choices = settle(**{name: value for name, value in locals().items() if name in OPTIONS})
        self.log_with = trackers.resolve(log_with)  # [metrics] names checked before anything
        self._handlers = choices.handlers
        self.project_configuration = choices.project
        self.dataloader_config = choices.dataloader
        self.step_scheduler_with_optimizer = choices.step_scheduler_with_optimizer
        self.rng_types = choices.rng_types
        self.deepspeed_plugin, self.dynamo_plugin = choices.deepspeed, choices.dynamo
        self.fsdp_plugin, self.parallelism_config = choices.fsdp, choices.mesh
        self.ddp_kwargs = choices.ddp_kwargs
        self.device_placement = device_placement
        self._process = choices.process_state(cpu)  # the job's size checked against the options
        self.precision = choices.precision_for(self._process)
        self.gradient_state = GradientState.for_accelerator(choices.accumulation_steps)
        # How models are spread over the processes: everything specific to one kind of
        # parallelism lives in its strategy (strategies/).
        self._strategy = choices.strategy_for(self._process, self.gradient_state)
        facts = accelerator_state.Facts(
            process=self._process,
            distributed_type=self._strategy.distributed_type,
            mixed_precision=self.precision.name,
            deepspeed_plugin=self.deepspeed_plugin,
            fsdp_plugin=self.fsdp_plugin,
            dynamo_plugin=self.dynamo_plugin,
            parallelism_config=self.parallelism_config,
            accelerator=weakref.ref(self),
        )
        # accelerate's accelerator.state: its AcceleratorState (the process helpers too)
        self.state = accelerator_state.AcceleratorState.of(facts)
        self.flag_tensor: torch.Tensor | None = None  # set_trigger / check_trigger
        self.step = 0  # backward() calls, saved in checkpoints
        self._objects = checkpoint.Stateful()
        # OrderedDict: RemovableHandle keeps a weak reference, which a plain dict refuses.
        self._save_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._load_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        # Parameters that moving a model replaced during the current prepare() call.
        self._replaced: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
        self._shuffle_seed: int | None = None
        launch_seed = launched.option("seed")
        if launch_seed is not None:
            # A seed chosen at launch (argument, panel or config file) seeds every RNG, the
            # same on each rank, as set_seed(seed) at the top of the function would.
            set_seed(launch_seed)
        # [metrics] trackers and the live chart (trackers.py, reporting/live.py)
        self.trackers: list[trackers.GeneralTracker] = []
        self._live = live.relay() if self.is_main_process else None
        live.count_steps(lambda: self.step)
        accelerator_state.register(facts)  # AcceleratorState(), state.is_initialized()

    # ---- process facts -------------------------------------------------------------------
    # device, process_index, num_processes, is_main_process, ...: ProcessView's
    distributed_type = property(
        lambda self: self._strategy.distributed_type, doc="NO/MULTI_CPU/.../FSDP/DEEPSPEED."
    )
    mixed_precision = property(
        lambda self: self.precision.name, doc="'no', 'fp16', 'bf16' or 'fp8'."
    )
    scaler = property(lambda self: self.precision.scaler, doc="fp16's GradScaler, else None.")
    sync_gradients = property(
        lambda self: self.gradient_state.sync_gradients, doc="Does this micro-batch step?"
    )

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step; settable, as accelerate's (the gradient state
        follows at once: the next :meth:`accumulate` counts to the new number)."""
        return self.gradient_state.accumulation_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        if value is None:  # None means "the launcher's" only at construction
            raise ConfigError("gradient_accumulation_steps", value, "an int >= 1")
        self.gradient_state.accumulation_steps = accumulation_steps(value)

    project_dir = property(
        lambda self: self.project_configuration.project_dir, doc="The run's folder, or None."
    )
    logging_dir = property(
        lambda self: self.project_configuration.logging_dir, doc="Where trackers write."
    )

    split_batches = property(
        lambda self: self.dataloader_config.split_batches, doc="Loaders cut global batches."
    )
    even_batches = property(
        lambda self: self.dataloader_config.even_batches, doc="Last rounds are completed."
    )
    dispatch_batches = property(
        lambda self: self.dataloader_config.dispatch_batches, doc="Main process reads data."
    )
    non_blocking = property(
        lambda self: self.dataloader_config.non_blocking, doc="Asynchronous batch copies."
    )
    use_seedable_sampler = property(
        lambda self: self.dataloader_config.use_seedable_sampler, doc="Seed+epoch shuffles."
    )
    use_stateful_dataloader = property(
        lambda self: self.dataloader_config.use_stateful_dataloader,
        doc="Loaders with StatefulDataLoader's state_dict (ours have it either way).",
    )

    @property
    def profile_handler(self) -> ProfileKwargs | None:
        """The ``ProfileKwargs`` of ``kwargs_handlers``, if the user gave one."""
        return self._handlers.of(ProfileKwargs)

    # ---- accelerate 1.16's attributes: fp8, the mesh's ranks, saving, LOMO ----------------
    @property
    def fp8_enabled(self) -> bool:
        """Whether training runs in fp8 (``mixed_precision="fp8"``)."""
        return self.precision.name == "fp8"

    @property
    def ao_recipe_handler(self) -> Any:
        """The ``AORecipeKwargs`` in use: the one given, else fp8's default, else None."""
        given = self._handlers.named("AORecipeKwargs")
        return given if given is not None else getattr(self.precision, "recipe", None)

    @property
    def has_fp8_handler(self) -> bool:
        """Whether an fp8 recipe is in use (given, or made for ``mixed_precision="fp8"``)."""
        return self.ao_recipe_handler is not None

    @property
    def fp8_backend(self) -> Any:
        """``FP8BackendType.AO`` (torchao) with an fp8 recipe; else, as accelerate, the
        backend ``ACCELERATE_FP8_BACKEND`` names (``NO`` by default)."""
        from .precision.fp8 import FP8BackendType

        if self.has_fp8_handler:
            return FP8BackendType.AO
        return FP8BackendType(env.fp8_backend())

    delayed_fp8_autocast = property(
        lambda self: False, doc="False: Transformer Engine's delayed fp8 autocast is not here."
    )

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``: every FSDP here is), by
        ``fsdp``/``fsdp_plugin`` or a ``parallelism_config`` with ``dp_shard_size > 1``."""
        mesh = self.parallelism_config
        return self.distributed_type == DistributedType.FSDP or (
            mesh is not None and mesh.dp_shard_size > 1
        )

    is_composable_parallelism_enabled = property(
        lambda self: self.is_fsdp2, doc="accelerate's: :attr:`is_fsdp2`."
    )

    @property
    def multi_device(self) -> bool:
        """Several processes, each on its own accelerator, without a sharding strategy
        (accelerate's MULTI_GPU and kin)."""
        return self.use_distributed and self.distributed_type in _MULTI_DEVICE

    def _mesh_rank(self, dim: str, what: str) -> int:
        mesh = self.parallelism_config
        if mesh is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return mesh.coordinate(dim, self.process_index)

    @property
    def data_parallel_rank(self) -> int:
        """This process's index along the mesh's ``dp_replicate`` dimension (0 without it).

        Raises:
            RuntimeError: no ``parallelism_config`` (accelerate's refusal).
        """
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index along the mesh's ``dp_shard`` dimension (0 without it)."""
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index along the mesh's ``tp`` dimension (0 without it)."""
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def context_parallel_rank(self) -> int:
        """Raises NotImplementedError, as accelerate's: no context parallelism."""
        raise NotImplementedError("Context parallelism is not supported (nor in accelerate).")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Raises NotImplementedError, as accelerate's: no pipeline parallelism."""
        raise NotImplementedError("Pipeline parallelism is not supported (nor in accelerate).")

    save_iteration = property(
        lambda self: self.project_configuration.iteration,
        doc="The number the next automatically named checkpoint gets.",
    )

    @property
    def should_save_model(self) -> bool:
        """accelerate's: every process with a ``parallelism_config`` (each writes its part),
        else each machine's local main process."""
        return self.parallelism_config is not None or self.is_local_main_process

    @staticmethod
    def verify_device_map(model: torch.nn.Module) -> bool:
        """Whether ``model`` (or a submodule) was loaded with a device map over several
        devices (transformers' ``hf_device_map``): such a model is not trained in parallel."""
        return any(len(getattr(m, "hf_device_map", ())) > 1 for m in model.modules())

    @property
    def has_lomo_optimizer(self) -> bool:
        """Whether a LOMO optimizer (``lomo_optim``'s Lomo or AdaLomo) was prepared."""
        return any(_is_lomo(opt.optimizer) for opt in self._objects.optimizer)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """The backward pass of the prepared LOMO optimizers (their ``fused_backward``,
        which also steps them), as accelerate's.

        Raises:
            ConfigError: no learning rate, or no LOMO optimizer was prepared.
        """
        if learning_rate is None:
            raise ConfigError("learning_rate", None, "the learning rate of the LOMO step")
        lomo = [opt.optimizer for opt in self._objects.optimizer if _is_lomo(opt.optimizer)]
        if not lomo:
            raise ConfigError(
                "lomo_backward()",
                "no LOMO optimizer prepared",
                "a lomo_optim Lomo or AdaLomo passed to accelerator.prepare()",
            )
        for optimizer in lomo:
            optimizer.fused_backward(loss, learning_rate)

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: torch.nn.Module) -> Any:
        """accelerate's adapter of a loader to DeepSpeed's sequence parallelism: the loader
        itself, as accelerate's returns it with ``sp_size == 1`` (the only size here)."""
        return dl

    def profile(
        self, profile_handler: ProfileKwargs | None = None
    ) -> contextlib.AbstractContextManager[torch.profiler.profile]:
        """Profile the block with ``torch.profiler`` (options: ``profile_handler``, else the
        Accelerator's ``ProfileKwargs``, else torch's defaults); with ``output_trace_dir``,
        each rank writes ``profile_<rank>.json`` there and the ranks wait for each other.

        Example:
            >>> with accelerator.profile() as prof:  # doctest: +SKIP
            ...     train_step()
            >>> accelerator.print(prof.key_averages().table(row_limit=5))  # doctest: +SKIP
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        return profiled(handler, self.process_index, self.wait_for_everyone)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 gradients overflowed)."""
        return any(opt.step_was_skipped for opt in self._objects.optimizer)

    # ---- prepare -------------------------------------------------------------------------
    def prepare(self, *objects: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and LR schedulers; same order back.

        Args:
            objects: the models, optimizers, loaders and schedulers.
            device_placement: one entry per object: whether to move that model (or that
                loader's batches) to :attr:`device`; ``None`` (or an entry ``None``): the
                Accelerator's ``device_placement``. An optimizer's state follows its
                parameters either way.

        Raises:
            ConfigError: an object of another type (it names the argument's position), or a
                ``device_placement`` list of another length.
        """
        places: list[bool | None] = [None] * len(objects)
        if device_placement is not None:
            if not isinstance(device_placement, list | tuple) or len(device_placement) != len(
                objects
            ):
                raise ConfigError(
                    "device_placement",
                    device_placement,
                    f"a list of {len(objects)} bools (or None), one per object prepared",
                )
            places = list(device_placement)
        handlers: list[tuple[type, Callable[[Any], Any]]] = [
            (torch.nn.Module, self._prepare_model),
            (torch.optim.Optimizer, self._prepare_optimizer),
            (DataLoader, self._prepare_loader),
            (LRScheduler, self._prepare_scheduler),
            (DummyOptim, self._prepare_optimizer),  # DeepSpeed's config sections
            (DummyScheduler, self._prepare_scheduler),
        ]
        done = (AcceleratedOptimizer, DataLoaderShard, AcceleratedScheduler)
        plan: list[Callable[[Any], Any] | None] = []
        for i, obj in enumerate(objects):
            match = next((h for kind, h in handlers if isinstance(obj, kind)), None)
            finished = isinstance(obj, done) or (
                isinstance(obj, torch.nn.Module)
                and (self._strategy.is_prepared(obj) or any(obj is m for m in self._objects.model))
            )
            if match is None and not finished:
                raise ConfigError(
                    f"prepare() argument {i + 1}",
                    type(obj).__name__,
                    "a torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader "
                    "or torch.optim.lr_scheduler.LRScheduler",
                )
            if match is not None and places[i] is not None and not finished:
                if match in (self._prepare_model, self._prepare_loader):
                    match = functools.partial(match, device_placement=places[i])
            plan.append(None if finished else match)
        # Models first (moving one may replace its parameters, which the optimizers of this
        # call must then follow); schedulers last (they must find their optimizer wrapped).
        self._strategy.begin_prepare(objects)
        rank = {self._prepare_model: 0, self._prepare_scheduler: 2}

        def order_of(i: int) -> int:
            handler = plan[i]
            return rank.get(getattr(handler, "func", handler), 1)  # type: ignore[arg-type]

        out = list(objects)
        order = sorted(range(len(objects)), key=order_of)
        self._replaced = {}
        try:
            for i in order:
                handler = plan[i]
                out[i] = objects[i] if handler is None else handler(objects[i])
        finally:
            self._replaced = {}  # drop the old parameters: nothing else may refer to them
        return out[0] if len(out) == 1 else tuple(out)

    def _prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        before = list(model.parameters())
        # fp8 swaps Linear layers (new Parameter objects): optimizers follow, as after .to().
        sharded = self._strategy.shards_parameters and not evaluation_mode
        model = self.precision.convert_model(model, sharded)
        if self.device_placement if device_placement is None else device_placement:
            move_keeping_ties(model, self.device)  # TorchTPU's .to() unties weights
        # On XLA (and with torch's overwrite-on-conversion flag) .to() makes new Parameter
        # objects; an optimizer built on the model beforehand must step the new ones.
        replaced = {
            id(old): (old, new)
            for old, new in zip(before, model.parameters(), strict=True)
            if old is not new
        }
        if replaced and self._strategy.keeps_parameters:
            self._replaced.update(replaced)
            for opt in self._objects.optimizer:
                _follow_parameters(opt.optimizer, replaced)
        self.precision.wrap_forward(model, **self._handlers.kwargs(AutocastKwargs))
        if not evaluation_mode:  # inference only: device and precision, no wrapper
            model = self._strategy.prepare_model(model)
            for opt in self._objects.optimizer:  # optimizers prepared before their model
                self._strategy.prepare_optimizer(opt.optimizer)
        model = compiling.compile_model(model, self.dynamo_plugin)  # last, as accelerate
        self._objects.model.append(model)
        return model

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        if self._replaced:
            _follow_parameters(optimizer, self._replaced)
        self._strategy.prepare_optimizer(optimizer)
        wrapped = self._strategy.wrap_optimizer(optimizer, self.precision, self.gradient_state)
        self._objects.optimizer.append(wrapped)
        return wrapped

    def _prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        target = scheduler.optimizer  # the user's optimizer, or our wrapper if made after prepare
        mine = [
            o
            for o in self._objects.optimizer
            if any(target is x for x in (o, o.optimizer, getattr(o, "source", None)))
        ]
        wrapped = self._strategy.wrap_scheduler(
            scheduler,
            mine,
            num_processes=self.num_processes,
            split_batches=self.split_batches,
            step_with_optimizer=self.step_scheduler_with_optimizer,
        )
        self._objects.scheduler.append(wrapped)
        return wrapped

    def _prepare_loader(
        self, loader: DataLoader[Any], device_placement: bool | None = None
    ) -> DataLoaderShard:
        config = self.dataloader_config
        if config.use_seedable_sampler:
            # data_seed, else the initial seed now (accelerate's: the last set_seed, or the
            # launch's seed), rank 0's for every rank so that they all draw one permutation.
            seed = torch.initial_seed() if config.data_seed is None else config.data_seed
            self._shuffle_seed = int(collectives.broadcast_object_list([seed])[0])
        shard = shard_data_loader(
            loader,
            self._strategy.data_state(),
            self.gradient_state,
            self._shuffle_seed or 0,
            device_placement=self.device_placement
            if device_placement is None
            else device_placement,
            config=config,
        )
        shard.use_stateful_dataloader = config.use_stateful_dataloader
        if any(name != "generator" for name in self.rng_types):
            shard.synchronize_rng = functools.partial(synchronize_rng_states, self.rng_types)
        self._objects.loader.append(shard)
        return shard

    # ---- training step -------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for fp16.

        With a prepared LOMO optimizer and ``learning_rate=``, its fused backward and step
        (:meth:`lomo_backward`), as accelerate's.
        """
        self.step += 1
        if self.gradient_state.accumulation_steps > 1 and not self._strategy.scales_loss:
            loss = loss / self.gradient_state.accumulation_steps
        learning_rate = kwargs.get("learning_rate")
        if learning_rate is not None and self.scaler is None and self.has_lomo_optimizer:
            self.lomo_backward(loss, learning_rate)
            return
        self._strategy.backward(loss, self.precision, **kwargs)

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """The mixed precision context (prepared models already run in it).

        ``autocast_handler`` (else the ``AutocastKwargs`` of ``kwargs_handlers``) passes its
        options to ``torch.autocast``: ``AutocastKwargs(enabled=False)`` runs the block in
        full precision.
        """
        handler = autocast_handler or self._handlers.of(AutocastKwargs)
        options = handler.to_kwargs() if handler is not None else {}
        return self.precision.autocast(**options)

    @property
    def native_amp(self) -> bool:
        """Whether torch's autocast runs the mixed precision (accelerate's flag): fp16 and
        bf16 without DeepSpeed (which keeps its own half-precision weights), and fp8."""
        return self.precision.native_amp

    @property
    def use_fp16(self) -> bool:
        """Deprecated in accelerate (removed before 1.0): ``mixed_precision != "no"``."""
        warnings.warn(
            "Accelerator.use_fp16 is deprecated, as in accelerate; use "
            "accelerator.mixed_precision != 'no' (or == 'fp16').",
            FutureWarning,
            stacklevel=2,
        )
        return self.mixed_precision != "no"

    @property
    def torch_device_mesh(self) -> Any:
        """The ``DeviceMesh`` of a ``parallelism_config`` (as accelerate's: None without one).

        A collective the first time on a job's ranks (before ``prepare``): read it on every
        rank.
        """
        return None if self.parallelism_config is None else self._strategy.device_mesh

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """accelerate's context-parallel block. Context parallelism is never on here
        (ParallelismConfig's ``cp_size`` must be 1), so, as accelerate does without it, the
        block runs unchanged and the main process logs a warning once per process."""
        _logger.warning_once(
            "Context parallel training is not enabled. This context manager will have no "
            "effect (notebook_accel has no context parallelism)."
        )
        yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce inside the block (a no-op in one process)."""
        with self._strategy.no_sync(compiling.strategy_view(model)):
            yield

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch: gradients are all-reduced, and optimizers step, every N-th time.

        Example:
            >>> with accelerator.accumulate(model):
            ...     accelerator.backward(loss_fn(model(x), y))
            ...     optimizer.step()
            ...     optimizer.zero_grad()
        """
        self.gradient_state.advance()
        with contextlib.ExitStack() as stack:
            if not self.gradient_state.sync_gradients:
                for model in models or tuple(self._objects.model):
                    stack.enter_context(self.no_sync(model))
            yield

    def unscale_gradients(
        self, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None
    ) -> None:
        """Divide fp16-scaled gradients back (once per step); a no-op for other precisions.

        ``optimizer``: one optimizer or a list of them; default: every prepared optimizer.
        """
        if optimizer is None:
            targets: list[Any] = list(self._objects.optimizer)
        else:
            targets = list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]
        for opt in targets:
            self.precision.unscale_(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(
        self, parameters: _Params, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients' norm on synchronising steps; return the norm.

        Mid-accumulation the gradients are partial, so nothing is clipped and the partial norm
        is returned.
        """
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in params if p.grad is not None]
        if not self.sync_gradients:
            return self._strategy.grad_norm(grads, norm_type)
        self.unscale_gradients()
        return self._strategy.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: _Params, clip_value: float) -> None:
        """Clamp every gradient to ``[-clip_value, clip_value]`` on synchronising steps."""
        if self.sync_gradients:
            self.unscale_gradients()
            torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ---- collectives: the functions of ``collectives``, callable on the accelerator ---------
    gather = staticmethod(collectives.gather)
    reduce = staticmethod(collectives.reduce)
    broadcast = staticmethod(collectives.broadcast)
    pad_across_processes = staticmethod(collectives.pad_across_processes)
    gather_object = staticmethod(collectives.gather_object)
    split_between_processes = staticmethod(collectives.split_between_processes)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """:meth:`gather`, minus the samples that ``even_batches`` repeated at the epoch's end.

        Data that is not all tensors (strings, numbers, mixed nests) goes through
        :meth:`gather_object`, as in accelerate.
        """
        by_object = use_gather_object or not collectives.all_tensors(input_data)
        data = collectives.gather_object(input_data) if by_object else self.gather(input_data)
        keep = self.gradient_state.remainder
        if not self.gradient_state.end_of_dataloader or keep < 0:
            return data
        if isinstance(data, list) and by_object:
            return data[:keep]
        return collectives.apply(lambda t: t[:keep], data)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """The loader's next epoch without its first ``num_batches`` batches (for resuming).

        Example:
            >>> accelerator.load_state("ckpt")  # doctest: +SKIP
            >>> for batch in accelerator.skip_first_batches(loader, resume_step):  # doctest: +SKIP
            ...     ...
        """
        return skip_first_batches(dataloader, num_batches)

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Train on uneven inputs with torch's ``Join`` (DDP shadows the finished ranks).

        ``even_batches`` overrides the Accelerator's for the prepared map-style loaders inside
        the block; Join is active when batches are not evened. Unlike accelerate, it works on
        CPU (gloo) too. In one process it does nothing.

        Example:
            >>> with accelerator.join_uneven_inputs([model], even_batches=False):  # doctest: +SKIP
            ...     for x, y in loader:
            ...         ...
        """
        if self.num_processes == 1:
            yield
            return
        from torch.distributed.algorithms.join import Join

        loaders = list(self._objects.loader)
        before = [loader.even_batches for loader in loaders]
        if even_batches is not None:
            for loader in loaders:
                loader.even_batches = even_batches
        else:
            even_batches = self.even_batches
        try:
            with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
                yield
        finally:
            for loader, value in zip(loaders, before, strict=True):
                loader.even_batches = value

    # ---- processes: delegated to a PartialState over this Accelerator's state --------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's local main process only (as accelerate does)."""
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self._process.barrier()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first (e.g. a download), then on the others."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each machine's local main process first, then on the others."""
        return self.state.local_main_process_first()

    def on_main_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on the main process only (``None`` elsewhere)."""
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on each machine's local main process only."""
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self.state.on_last_process(function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on rank ``process_index`` only.

        Example:
            >>> @accelerator.on_process(process_index=1)  # doctest: +SKIP
            ... def report():
            ...     print("rank 1 here")
        """
        return self.state.on_process(function, process_index)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local rank ``local_process_index`` of each machine."""
        return self.state.on_local_process(function, local_process_index)

    def end_training(self) -> None:
        """End the trackers, wait for every process, leave the group this Accelerator made."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        if self._live is not None:
            self._live.flush()
        self.wait_for_everyone()
        self._strategy.end()
        if self._process.created_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # ---- one object at a time: accelerate's prepare_* (prepare() does all of them) ---------
    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Prepare one model: device, mixed precision, and DDP/FSDP unless ``evaluation_mode``.

        Args:
            model: the module.
            device_placement: move it to :attr:`device` (default: the Accelerator's setting).
            evaluation_mode: inference only: no DDP or FSDP wrapper, autocast still applies.
        """
        already = any(model is m for m in self._objects.model)
        if already or self._strategy.is_prepared(model):
            return model
        self._replaced = {}
        try:
            return self._prepare_model(model, device_placement, evaluation_mode)
        finally:
            self._replaced = {}

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Prepare one optimizer (prepare its model first). ``device_placement`` is accepted
        for accelerate's signature: the optimizer's state follows its parameters anyway."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        return self._prepare_optimizer(optimizer)

    def prepare_data_loader(
        self,
        data_loader: DataLoader[Any],
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., Any] | None = None,
    ) -> DataLoaderShard:
        """Prepare one data loader; ``device_placement`` overrides the Accelerator's setting.

        ``slice_fn_for_dispatch`` is accepted for accelerate's signature and unused: dispatched
        batches (``DataLoaderConfiguration.dispatch_batches``) are cut along their first
        dimension.
        """
        if isinstance(data_loader, DataLoaderShard):
            return data_loader
        return self._prepare_loader(data_loader, device_placement)

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Prepare one LR scheduler (prepare its optimizer first)."""
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        return self._prepare_scheduler(scheduler)

    # ---- triggers, gradient sync on demand, memory ------------------------------------------
    def set_trigger(self) -> None:
        """Raise this process's flag; the next :meth:`check_trigger` sees it on every process.

        Example:
            >>> if not torch.isfinite(loss):  # doctest: +SKIP
            ...     accelerator.set_trigger()
            >>> if accelerator.check_trigger():  # every process, same step  # doctest: +SKIP
            ...     break
        """
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process if any process called :meth:`set_trigger`; then reset.

        A collective: call it on every process at the same point.
        """
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        raised = int(collectives.reduce(self.flag_tensor, "sum").item()) >= 1
        if raised:
            self.flag_tensor = torch.tensor(0, device=self.device)
        return raised

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """All-reduce gradients in the next backward, though its forward ran under ``no_sync``.

        For several forward passes under :meth:`no_sync` followed by their backward passes: the
        last backward, inside this block, synchronises all the accumulated gradients. A no-op
        for a model that the strategy does not wrap (FSDP included).

        Example:
            >>> with accelerator.no_sync(model):  # doctest: +SKIP
            ...     loss_a, loss_b = loss_fn(model(a)), loss_fn(model(b))
            >>> accelerator.backward(loss_a)  # doctest: +SKIP
            >>> with accelerator.trigger_sync_in_backward(model):  # doctest: +SKIP
            ...     accelerator.backward(loss_b)
        """
        with self._strategy.trigger_sync_in_backward(compiling.strategy_view(model)):
            yield

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared model, optimizer, loader and scheduler, collect garbage and
        empty the device cache; returns a ``None`` per argument, to reassign.

        Call it between two trainings in one session (objects registered with
        :meth:`register_for_checkpointing` are kept, as under accelerate). Resets :attr:`step`.

        Example:
            >>> model, optimizer = accelerator.free_memory(model, optimizer)  # doctest: +SKIP
        """
        for kind in ("model", "optimizer", "loader", "scheduler"):
            getattr(self._objects, kind).clear()
        self.precision.forget()
        self.step = 0
        return release_memory(*objects)

    def clear(self, *objects: Any) -> list[None]:
        """Alias of :meth:`free_memory`."""
        return self.free_memory(*objects)

    # ---- trackers and the live chart (trackers.py, reporting/live.py) ----------------------------
    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the trackers of ``log_with`` on the main process, for ``project_name``.

        Args:
            project_name: the run's name (TensorBoard's sub-folder, MLflow's experiment,
                the W&B and trackio project).
            config: hyperparameters to record with the run.
            init_kwargs: per tracker name, keyword arguments for its library's start call
                (``{"wandb": {"tags": [...]}}``).

        Example:
            >>> accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
            >>> accelerator.init_trackers("exp1", config={"lr": 3e-4})
            >>> accelerator.log({"loss": 0.25}, step=1)
        """
        if not self.is_main_process:
            return
        made = [
            trackers.make(wanted, project_name, self.logging_dir, init_kwargs or {})
            for wanted in self.log_with
        ]
        self.trackers.extend(made)
        for tracker in made:  # as accelerate: every tracker started, then the config stored
            tracker.start()
        if config is not None:
            for tracker in made:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (``unwrap=True``: the library's own object).

        On the other processes a blank tracker whose methods do nothing, as in accelerate.

        Raises:
            ConfigError: no tracker of that name was started.
        """
        if not self.is_main_process:
            return trackers.GeneralTracker(_blank=True)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        started = [t.name for t in self.trackers] or "none started"
        raise ConfigError("get_tracker(name)", name, f"one of the started trackers: {started}")

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to every tracker, and to the live chart in the notebook.

        Main process only (a no-op elsewhere). In a launch, the values also reach the cell's
        chart and :func:`notebook_accel.last_metrics`.
        """
        # Called every iteration in many loops: a few attribute loads when there is no tracker.
        if self.trackers:
            for tracker in self.trackers:
                tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))
        live_ = self._live
        if live_ is not None:
            live_.add(step, values)

    # ---- models and checkpoints ----------------------------------------------------------
    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The user's module, without DDP (and without the autocast forward if asked).

        A compiled model: with ``keep_torch_compile`` its compiled form where it stands
        without the DDP wrapper (the compiled module in one process; with regional
        compilation, the module holding the compiled blocks), else the module as it was
        before compiling (its own state-dict names).
        """
        if not keep_torch_compile or compiling.strategy_view(model) is not model:
            base = compiling.uncompiled(model)
            inner = self._strategy.unwrap(base)
            if keep_torch_compile and inner is base:
                inner = model  # one process, compiled whole: the compiled module is the model
        else:
            inner = self._strategy.unwrap(model)
        if not keep_fp32_wrapper:
            AutocastForward.remove(inner)
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict (of the unwrapped module by default).

        An FSDP model's is gathered whole on the main process (``{}`` elsewhere): call it on
        every process.
        """
        return self._strategy.model_state_dict(compiling.uncompiled(model), unwrap=unwrap)

    def _writes_files(self) -> bool:
        """Whether this process writes shared files: the main process, or with
        ``save_on_each_node`` each machine's local main process (as accelerate)."""
        on_each_node = self.project_configuration.save_on_each_node
        return self.is_main_process or (on_each_node and self.is_local_main_process)

    def save(
        self, obj: Any, f: str | os.PathLike[str] | IO[bytes], safe_serialization: bool = False
    ) -> None:
        """``torch.save`` from the main process only (each machine's with ``save_on_each_node``).

        Args:
            obj: what to save.
            f: a path (written atomically) or an open binary file.
            safe_serialization: write a dict of tensors as safetensors instead of a pickle.

        No process waits for another, so it may be called on the main process alone.
        """
        if self._writes_files():
            if safe_serialization:
                checkpoint_files.save_weights_file(obj, f, safe=True)
            else:
                checkpoint_files.save_object(obj, f)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> Path:
        """Write the unwrapped weights to ``save_directory/model.safetensors`` (main process).

        Larger than ``max_shard_size`` (``"10GB"``, ``"500MB"`` or bytes): shards
        ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``, as
        accelerate and transformers write them. ``safe_serialization=False`` writes
        ``pytorch_model.bin``. An FSDP model is gathered first: call it on every process then.

        Returns:
            The weights file (the index file when sharded).

        Raises:
            ConfigError: ``save_directory`` is a file, or ``max_shard_size`` is not a size.
        """
        folder = Path(save_directory)
        if folder.is_file():
            raise ConfigError("save_directory", os.fspath(save_directory), "a folder, not a file")
        checkpoint_files.parse_size(max_shard_size)  # bad input fails on every process
        weights = self.get_state_dict(model)
        written: list[Path] = []
        if self._writes_files() and (weights or self.is_main_process):
            written = checkpoint_files.save_model_files(
                weights, folder, safe_serialization, max_shard_size
            )
        name = "model.safetensors" if safe_serialization else "pytorch_model.bin"
        return written[-1] if len(written) > 1 else folder / name

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Also save/load these objects (anything with ``state_dict``/``load_state_dict``)."""
        for i, obj in enumerate(objects):
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise ConfigError(
                    f"register_for_checkpointing() argument {i + 1}",
                    type(obj).__name__,
                    "an object with state_dict() and load_state_dict()",
                )
            self._objects.custom.append(obj)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in :meth:`save_state` before writing.

        ``models`` are the prepared models, ``weights`` their state dicts (the ones that will
        be written as ``model[_i].safetensors``) and ``output_dir`` the folder, as a string.
        A hook that saves a model its own way removes its entry from ``weights``.

        Returns:
            A handle; ``handle.remove()`` unregisters the hook.
        """
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in :meth:`load_state` before reading.

        A hook that loads a model its own way removes it from ``models``; the others are
        loaded from ``model.safetensors``, ``model_1.safetensors``... in order.

        Returns:
            A handle; ``handle.remove()`` unregisters the hook.
        """
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle

    def _checkpoint_folder(self) -> Path:
        """``project_dir/checkpoints/checkpoint_<iteration>``, pruned to ``total_limit``."""
        config = self.project_configuration
        folder = config.next_checkpoint()
        if self._writes_files():
            config.make_room()
            if folder.exists():
                raise ConfigError(
                    "project_config.iteration",
                    config.iteration,
                    f"the number of a checkpoint not yet in {config.checkpoints_dir}",
                    "Set accelerator.project_configuration.iteration to the next free number.",
                )
        return folder

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> Path:
        """Checkpoint everything prepared, the step counters and every rank's RNG states.

        Written in accelerate's file layout (``model.safetensors``, ``optimizer.bin``,
        ``random_states_<rank>.pkl``...) to a temporary folder renamed into place: a crash
        keeps the previous checkpoint. May be called on the main process alone (the other
        ranks' random states are then not saved). With
        ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
        ``project_dir/checkpoints/checkpoint_<iteration>`` (``output_dir`` is ignored) and
        at most ``total_limit`` such folders are kept.

        Args:
            output_dir: the checkpoint folder.
            safe_serialization: weights as safetensors (else ``pytorch_model.bin``).
            save_model_func_kwargs: accepted for accelerate's signature (DeepSpeed's options);
                unused.

        Raises:
            ConfigError: no folder given and automatic naming off, or the automatic folder
                exists already.
        """
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            folder = self._checkpoint_folder()
        elif output_dir is None:
            raise ConfigError(
                "output_dir",
                None,
                "a folder (or ProjectConfiguration(automatic_checkpoint_naming=True))",
            )
        else:
            folder = Path(output_dir)
        objects, sharded = self._strategy.checkpoint_parts(self._objects)
        models = list(self._objects.model)
        plain = [] if sharded else [self.unwrap_model(m, keep_torch_compile=False) for m in models]
        weights = [m.state_dict() for m in plain]
        for hook in list(self._save_state_pre_hooks.values()):
            hook(models, weights, os.fspath(folder))
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        path = checkpoint.save_state(
            folder,
            self._process,
            objects,
            weights,
            {"step": self.step, "micro_step": self.gradient_state.micro_step},
            scaler=scaler,
            write_sharded=sharded.save if sharded else None,
            on_each_node=config.save_on_each_node,
            safe=safe_serialization,
        )
        config.iteration += 1
        return path

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore what :meth:`save_state` (ours or accelerate's) wrote; prepare the same
        objects first.

        Without ``input_dir``, automatic checkpoint naming loads the newest
        ``checkpoint_<n>``, and later saves continue from ``checkpoint_<n+1>``.

        Nothing is unpickled but tensors and plain data: every file is read with
        ``weights_only=True`` (DCP's metadata through a reader of its own classes only), and
        a file that needs more is refused, naming it, as a planted pickle in a downloaded
        folder would run code. Unlike accelerate, ``custom_checkpoint_<n>.pkl`` too. For a
        folder you trust: ``load_state(folder, load_kwargs={"weights_only": False})``.

        Args:
            input_dir: the checkpoint folder.
            load_kwargs: accelerate's options for the loads; ``{"weights_only": False}``
                unpickles whatever the files hold. Others are ignored (files are read on the
                CPU).
            load_model_func_kwargs: accepted for accelerate's signature; unused.

        Raises:
            CheckpointError: a file is missing, does not match, or needs full unpickling
                without the opt-in (it names the file).
            ConfigError: no folder given and automatic naming off; ``weights_only`` not a bool.

        Example:
            >>> accelerator.load_state("ckpt")  # doctest: +SKIP
            >>> trust = {"weights_only": False}  # a folder you trust
            >>> accelerator.load_state("mine", load_kwargs=trust)  # doctest: +SKIP
        """
        trusted = checkpoint.trusted(load_kwargs)
        config = self.project_configuration
        if input_dir is None:
            if not config.automatic_checkpoint_naming:
                raise ConfigError(
                    "input_dir",
                    None,
                    "a folder (or ProjectConfiguration(automatic_checkpoint_naming=True))",
                )
            latest = config.latest_checkpoint()
            if latest is None:
                raise CheckpointError(config.checkpoints_dir, "holds no checkpoint_<n> folder")
            input_dir = latest
            config.iteration = max(config.iteration, int(latest.name.rsplit("_", 1)[1]) + 1)
        objects, sharded = self._strategy.checkpoint_parts(self._objects, input_dir)
        models = list(objects.model)
        for hook in list(self._load_state_pre_hooks.values()):
            hook(models, os.fspath(input_dir))
        progress = checkpoint.load_state(
            input_dir,
            self._process,
            dataclasses.replace(objects, model=[compiling.uncompiled(m) for m in models]),
            read_sharded=functools.partial(sharded.load, trusted=trusted) if sharded else None,
            scaler=self.scaler,
            trusted=trusted,
        )
        self.step = progress["step"]
        self.gradient_state.micro_step = progress["micro_step"]

    def __repr__(self) -> str:
        return (
            f"Accelerator(device={self.device}, num_processes={self.num_processes}, "
            f"mixed_precision={self.mixed_precision!r})"
        )


# accelerate's multi_device kinds (MULTI_TPU: TorchTPU's processes, one per chip)
_MULTI_DEVICE = frozenset(
    {
        DistributedType.MULTI_GPU,
        DistributedType.MULTI_XPU,
        DistributedType.MULTI_NPU,
        DistributedType.MULTI_MLU,
        DistributedType.MULTI_SDAA,
        DistributedType.MULTI_MUSA,
        DistributedType.MULTI_HPU,
        DistributedType.MULTI_NEURON,
        DistributedType.MULTI_TPU,
    }
)


def _is_lomo(optimizer: Any) -> bool:
    """A ``lomo_optim`` Lomo or AdaLomo (by its class: lomo_optim is not imported here)."""
    kind = type(optimizer)
    return kind.__module__.split(".")[0] == "lomo_optim" and kind.__name__ in ("Lomo", "AdaLomo")


def shards_parameters(accelerator: Accelerator) -> bool:
    """Whether ``accelerator``'s strategy shards the model's parameters (FSDP, tensor
    parallel): what the training helpers that need whole replicas ask (LocalSGD)."""
    return accelerator._strategy.shards_parameters


def _follow_parameters(
    optimizer: torch.optim.Optimizer,
    replaced: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]],
) -> None:
    """Point ``optimizer`` (its groups and its state) at the parameters that replaced old ones."""
    for group in optimizer.param_groups:
        group["params"] = [replaced[id(p)][1] if id(p) in replaced else p for p in group["params"]]
    for key in list(optimizer.state):
        if id(key) in replaced:
            new = replaced[id(key)][1]
            moved = {
                k: v.to(new.device) if isinstance(v, torch.Tensor) and v.dim() else v
                for k, v in optimizer.state.pop(key).items()
            }
            optimizer.state[new] = moved
