"""What ``Accelerator.prepare`` does to a DataLoader: the shard of this process.

shard_data_loader(loader, state, ...)
  IterableDataset -> iterable.py (main-process dispatch, or a per-rank IterableShard)
  dispatch_batches=True -> the main process reads the loader's (seedable) batches and
                     iterable.py's Dispatcher sends each rank its piece
  else            -> rounds.py's ShardSampler over the loader's (seedable) batches,
                     randomness.py's epoch draws (on several processes, a generator-less
                     sampler is seeded here, at prepare, as accelerate does), loader.py's
                     rebuilt DataLoader inside a DataLoaderShard
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ...errors import ConfigError
from ...private import torch as private_torch
from ..process import GradientState, ProcessState
from .config import DataLoaderConfiguration
from .iterable import Dispatcher, shard_iterable_loader
from .loader import DataLoaderShard, rebuild
from .randomness import (
    SeedableRandomSampler,
    epoch_randomness,
    main_sampler,
    samplers_of,
    seed_at_prepare,
)
from .rounds import ShardSampler

__all__ = ["shard_data_loader"]


def shard_data_loader(
    source: DataLoader[Any],
    state: ProcessState,
    gradients: GradientState,
    seed: int,
    split_batches: bool = False,
    even_batches: bool = True,
    device_placement: bool = True,
    config: DataLoaderConfiguration | None = None,
) -> DataLoaderShard:
    """Wrap ``source`` so this process iterates its own shard (see the module docstring).

    ``config`` (a :class:`DataLoaderConfiguration`) wins over ``split_batches`` and
    ``even_batches``; ``seed`` is the shuffle seed of ``use_seedable_sampler``.

    Raises:
        ConfigError: ``split_batches`` with a batch size the process count does not divide.
    """
    config = config or DataLoaderConfiguration(
        split_batches=split_batches, even_batches=even_batches
    )
    batch_size = source.batch_size
    sampler_is_batch_sampler = source.batch_sampler is None and isinstance(
        source.sampler, BatchSampler
    )
    if batch_size is None:
        batch_size = getattr(source.batch_sampler or source.sampler, "batch_size", None)
    if config.split_batches and batch_size is not None and batch_size % state.world_size:
        raise ConfigError(
            "split_batches",
            True,
            f"a batch_size divisible by num_processes={state.world_size}",
            f"The loader's batch_size is {batch_size}.",
        )
    device = state.device if device_placement else None
    if isinstance(source.dataset, IterableDataset):
        return shard_iterable_loader(source, state, gradients, config, device, batch_size)
    if source.batch_sampler is None and not sampler_is_batch_sampler:
        raise ConfigError(
            "DataLoader(batch_size=None)",
            None,
            "a loader that batches (batch_size >= 1, a batch_sampler, or a BatchSampler as "
            "its sampler)",
        )
    batches: Any = source.sampler if sampler_is_batch_sampler else source.batch_sampler
    drop_last = bool(getattr(batches, "drop_last", source.drop_last))
    samplers = samplers_of(source)
    random = source.sampler if isinstance(source.sampler, RandomSampler) else None
    if config.use_seedable_sampler and random is not None:
        if config.data_seed is not None:
            seed = config.data_seed
        seedable = SeedableRandomSampler(
            random.data_source,
            seed,
            replacement=random.replacement,
            num_samples=private_torch.sampler_num_samples(random),
        )
        batches = BatchSampler(seedable, batch_size or 1, drop_last)
        samplers = [seedable]
    if config.dispatch_batches:
        reader = ShardSampler(batches, 1, 0, batch_size, False, False, drop_last)
        base = rebuild(source, reader, sampler_is_batch_sampler, keep_generator=False)
        return _dispatched(base, source, state, gradients, config, device, samplers, seed)
    if state.world_size > 1 and not config.use_seedable_sampler:
        seed_at_prepare(main_sampler(source))
    randomness = epoch_randomness(source, samplers, state.world_size)
    shards = ShardSampler(
        batches,
        state.world_size,
        state.rank,
        batch_size,
        config.split_batches,
        config.even_batches,
        drop_last,
        randomness,
    )
    loader = rebuild(source, shards, sampler_is_batch_sampler)
    return DataLoaderShard(
        loader,
        source,
        shards,
        randomness,
        seed,
        device,
        gradients,
        non_blocking=config.non_blocking,
        world=state.world_size,
        split_batches=config.split_batches,
    )


def _dispatched(
    base: DataLoader[Any],
    source: DataLoader[Any],
    state: ProcessState,
    gradients: GradientState,
    config: DataLoaderConfiguration,
    device: Any,
    samplers: list[Any],
    seed: int,
) -> DataLoaderShard:
    """A map-style loader that the main process reads and dispatches (accelerate's way).

    ``base`` reads the user's (seedable) batches through a one-process ShardSampler, without
    the loader's ``generator`` (every rank's base seed comes from the global RNG). As in
    accelerate, the samplers are left alone: only the main process reads them, so a
    generator-less shuffle draws from its global RNG at each epoch's first batch. The last
    short round is cut evenly, whatever ``even_batches`` says.
    """
    reader: ShardSampler = base.batch_sampler or base.sampler  # type: ignore[assignment]
    if state.rank == 0:
        reader.randomness = epoch_randomness(source, samplers, 1, loader_generator=False)
    one = state.world_size == 1
    loader = base if one else Dispatcher(base, state, config.split_batches, source.drop_last)
    return DataLoaderShard(
        loader,
        source,
        reader if one else None,
        reader.randomness,
        seed,
        device,
        gradients,
        non_blocking=config.non_blocking,
        world=state.world_size,
        split_batches=config.split_batches,
        counter=None if one else loader,
        takers=[] if one else [getattr(reader.batches, "sampler", None)],
    )
