"""Data loader sharding: each process sees its part of what one process would see, per step.

    user's DataLoader ── its own sampler (RandomSampler and its generator kept) ── its batch
    │                    sampler (batches of the loader's size)
    │                                      │ EpochRandomness: at each epoch start, the
    │                                      │ samplers' generators agree across ranks
    │                                      v
    │   ShardSampler: rounds of W batches (or 1 batch cut in W with split_batches); rank r
    │                 takes batch r of each round (BatchSamplerShard's semantics)
    └─> a new DataLoader over the same dataset/collate/workers/generator
        └─> DataLoaderShard: moves batches to the device, flags the last batch, resumes

So the global batch at step k of a W-process run is the batch at step k of a one-process run
whose batch size is W times larger (same seed, same random draws). An ``IterableDataset`` goes
through ``data_iterable.py`` instead (the main process dispatches, or each rank keeps its part).

With ``even_batches`` the last round is completed with samples from the start of the epoch so
every process gets the same number of equally sized batches; ``GradientState.remainder`` then
says how many gathered samples of that round are real, for ``gather_for_metrics``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from . import collectives
from .collectives import apply
from .data_config import DataLoaderConfiguration
from .errors import ConfigError
from .state import GradientState, ProcessState

__all__ = [
    "SeedableRandomSampler",
    "EpochRandomness",
    "plan_rounds",
    "ShardSampler",
    "DataLoaderShard",
    "shard_data_loader",
    "skip_first_batches",
]


class SeedableRandomSampler(RandomSampler):
    """A RandomSampler whose epoch ``e`` is the permutation of ``initial_seed + e``.

    ``use_seedable_sampler=True`` swaps the loader's RandomSampler for this one: the order then
    depends only on the seed and the epoch, not on the random draws made before.
    """

    def __init__(self, data_source: Any, initial_seed: int, **kwargs: Any) -> None:
        super().__init__(data_source, **kwargs)
        self.initial_seed = initial_seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation for the next iteration."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator = torch.Generator().manual_seed((self.initial_seed + self.epoch) % 2**63)
        yield from super().__iter__()


def _draw_seed() -> int:
    # The very draw RandomSampler makes from the global RNG when it has no generator.
    return int(torch.empty((), dtype=torch.int64).random_().item())


class EpochRandomness:
    """Keeps the random draws of a loader's epoch equal on every rank, and replayable.

    Two kinds of source: ``generators`` the user gave (a sampler's or the loader's): rank 0's
    state is sent to all at each epoch start, as accelerate does; and ``drawn`` samplers whose
    generator is None: each epoch they get a generator seeded by a draw from the global RNG
    (exactly RandomSampler's own draw), rank 0's draw for everyone. Re-seeding either source
    (``set_seed``, ``generator.manual_seed``) after ``prepare`` therefore still takes effect.
    ``seeds``/``states`` are the current epoch's, saved by checkpoints; :meth:`begin_epoch`
    with a ``replay`` restores them instead of drawing (a resumed epoch draws nothing).
    """

    def __init__(self, drawn: list[Any], generators: list[torch.Generator], world: int) -> None:
        self.drawn, self.generators, self.world = drawn, generators, world
        self.seeds: list[int] = []
        self.states: list[torch.Tensor] = []
        self._replay: dict[str, Any] | None = None

    def begin_epoch(self, replay: dict[str, Any] | None) -> None:
        """At iteration start: align (or restore) the generators, before anything draws."""
        # A checkpoint made for other samplers (or by an older version) replays nothing.
        if replay is not None and len(replay["seeds"]) != len(self.drawn):
            replay = None
        if replay is not None and len(replay["states"]) != len(self.generators):
            replay = None
        self._replay = replay
        if replay is not None:
            for generator, state in zip(self.generators, replay["states"], strict=True):
                generator.set_state(state)
        elif self.world > 1 and self.generators:
            states = collectives.broadcast_object_list([[g.get_state() for g in self.generators]])
            for generator, state in zip(self.generators, states[0], strict=True):
                generator.set_state(state)
        self.states = [g.get_state() for g in self.generators]

    @contextlib.contextmanager
    def drawn_generators(self) -> Iterator[None]:
        """While the samplers are read: give the generator-less ones this epoch's generator."""
        if not self.drawn:
            yield
            return
        if self._replay is not None:
            seeds = [int(s) for s in self._replay["seeds"]]
        else:
            seeds = [_draw_seed() for _ in self.drawn]
            if self.world > 1:
                seeds = collectives.broadcast_object_list([seeds])[0]
        self._replay, self.seeds = None, seeds
        for sampler, seed in zip(self.drawn, seeds, strict=True):
            sampler.generator = torch.Generator().manual_seed(seed)
        try:
            yield
        finally:
            for sampler in self.drawn:
                sampler.generator = None


def _fixed_slices(flat: list[int], per: int, world: int) -> list[list[int]]:
    return [flat[k * per : (k + 1) * per] for k in range(world)]


def plan_rounds(
    batches: list[list[int]],
    world: int,
    batch_size: int | None,
    split_batches: bool,
    even_batches: bool,
    drop_last: bool = False,
) -> tuple[list[list[list[int]]], int]:
    """An epoch's rounds (one piece per rank) and the real sample count of the last round.

    ``-1`` means nothing was padded. The last round, if short, is dropped (``drop_last``),
    left short (``even_batches=False``) or completed from the epoch's start.

    Example:
        >>> plan_rounds([[0, 1], [2, 3], [4]], 2, 2, False, True)
        ([[[0, 1], [2, 3]], [[4, 0], [1, 2]]], 1)
    """
    size = batch_size or (len(batches[0]) if batches else 0)
    if split_batches:
        per = size // world
        rounds = [_fixed_slices(b, per, world) for b in batches]
        full = size
    else:
        per = size
        rounds = [batches[i : i + world] for i in range(0, len(batches), world)]
        full = size * world
    # One process needs no padding: it behaves exactly like the plain DataLoader.
    if not rounds or world == 1:
        return rounds, -1
    last = [i for piece in rounds[-1] for i in piece]
    real = len(last)
    if real == full:
        return rounds, -1
    if drop_last:
        return rounds[:-1], -1
    if not even_batches:
        return rounds, -1
    # Complete the last round from the start of the epoch (cycling for tiny datasets).
    everything = [i for b in batches for i in b]
    last += list(itertools.islice(itertools.cycle(everything), full - real))
    rounds[-1] = _fixed_slices(last, per, world)
    return rounds, real


class ShardSampler(Sampler[list[int]]):
    """Yields this rank's index batches of the epoch being iterated, after ``skip`` rounds.

    Nothing is cached between iterations: each one reads the user's batch sampler afresh
    (so a seed changed in between, by ``load_state`` or the user, is always honoured), and
    the length is arithmetic.
    """

    def __init__(
        self,
        batches: Iterable[list[int]],
        world: int,
        rank: int,
        batch_size: int | None,
        split_batches: bool,
        even_batches: bool,
        drop_last: bool = False,
        randomness: EpochRandomness | None = None,
    ) -> None:
        self.batches = batches
        self.world, self.rank = world, rank
        self.batch_size = batch_size
        self.split_batches, self.even_batches = split_batches, even_batches
        self.drop_last = drop_last
        self.randomness = randomness or EpochRandomness([], [], world)
        self.skip = 0
        self.remainder = -1  # of the epoch last planned

    def __iter__(self) -> Iterator[list[int]]:
        with self.randomness.drawn_generators():
            batches = [list(b) for b in self.batches]
        rounds, self.remainder = plan_rounds(
            batches,
            self.world,
            self.batch_size,
            self.split_batches,
            self.even_batches,
            self.drop_last,
        )
        skip, self.skip = self.skip, 0
        for round_ in rounds[skip:]:
            if self.rank < len(round_) and round_[self.rank]:
                yield round_[self.rank]

    def __len__(self) -> int:
        count = len(self.batches)  # type: ignore[arg-type]
        if self.world == 1:
            return count
        if self.split_batches:
            last = self._last_batch_size()
            if self.even_batches or last is None or last == 0 or self.batch_size is None:
                return count
            return count - (0 if last > (self.batch_size // self.world) * self.rank else 1)
        rounds, extra = divmod(count, self.world)
        if extra == 0:
            return rounds
        if self.drop_last:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + (1 if self.rank < extra else 0)

    def _last_batch_size(self) -> int | None:
        """Size of the epoch's last batch when the batch sampler makes it knowable."""
        sampler = getattr(self.batches, "sampler", None)
        size = getattr(self.batches, "batch_size", None)
        if size is None or getattr(self.batches, "drop_last", False):
            return None
        try:
            return len(sampler) % size  # type: ignore[arg-type]
        except TypeError:
            return None


_END = object()


class DataLoaderShard:
    """This process's view of a prepared DataLoader: its batches, on its device.

    Iterating again starts the next epoch; ``set_epoch`` picks the epoch number passed on to
    samplers and datasets that have ``set_epoch``. ``state_dict``/``load_state_dict`` carry the
    epoch, the position in it and the epoch's random draws, for resuming mid-epoch.

    Example:
        >>> loader = accelerator.prepare(DataLoader(dataset, batch_size=8, shuffle=True))
        >>> for x, y in loader:  # this rank's batches, already on accelerator.device
        ...     pass
    """

    def __init__(
        self,
        loader: Any,
        source: DataLoader[Any],
        sampler: ShardSampler | None,
        randomness: EpochRandomness,
        seed: int,
        device: torch.device | None,
        gradients: GradientState,
        non_blocking: bool = False,
        world: int = 1,
        split_batches: bool = False,
        counter: Any = None,
    ) -> None:
        self._loader, self._source, self._sampler = loader, source, sampler
        # What knows the last round's real sample count (``remainder``) once it was planned.
        self._counter = sampler if sampler is not None else counter
        self._randomness = randomness
        self.seed = seed  # of use_seedable_sampler
        self.device = device if device is not None and device.type != "cpu" else None
        self.gradients = gradients
        self.non_blocking = non_blocking
        self._world, self._split = world, split_batches
        self.epoch = 0
        self.position = 0  # batches this rank has yielded in ``epoch``
        self._iterated = False
        self._resume: tuple[int, int, dict[str, Any] | None] | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "_source" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_source"], name)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step across all processes (the loader's batch size x processes)."""
        size = self._source.batch_size
        if size is None:
            size = getattr(self._source.sampler, "batch_size", None)
        return size if size is None or self._split else size * self._world

    @property
    def total_dataset_length(self) -> int:
        """Samples in the dataset."""
        return len(self._source.dataset)  # type: ignore[arg-type]

    @property
    def even_batches(self) -> bool:
        """Whether the last round is completed (map-style datasets; ``join_uneven_inputs``)."""
        return self._sampler.even_batches if self._sampler is not None else True

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if self._sampler is not None:
            self._sampler.even_batches = value

    def set_epoch(self, epoch: int) -> None:
        """Number the next iteration ``epoch`` (passed to the samplers' ``set_epoch``)."""
        self._resume = (epoch, 0, None)

    def _begin(self) -> tuple[dict[str, Any] | None, int]:
        fresh = (self.epoch + (1 if self._iterated else 0), 0, None)
        epoch, skip, replay = self._resume or fresh
        self._resume, self._iterated = None, True
        self.epoch, self.position = epoch, skip
        for target in self._epoch_takers():
            target.set_epoch(epoch)
        if self._sampler is not None:
            self._sampler.skip = skip
            return replay, 0
        return replay, skip

    def _epoch_takers(self) -> list[Any]:
        """The samplers and dataset that have ``set_epoch``, ours included."""
        targets: list[Any] = [self._source.dataset, *_samplers(self._source)]
        if self._sampler is not None:
            targets.append(getattr(self._sampler.batches, "sampler", None))
        return list({id(t): t for t in targets if hasattr(t, "set_epoch")}.values())

    def _start(self, replay: dict[str, Any] | None) -> Iterator[Any]:
        self._randomness.begin_epoch(replay)
        loader = self._loader
        if replay is None or not isinstance(loader, DataLoader) or loader.generator is not None:
            return iter(loader)
        # A resumed epoch must not draw the workers' base seed from the global RNG again
        # (the uninterrupted run drew it at the epoch's start, before the checkpoint).
        loader.generator = torch.Generator()
        try:
            return iter(loader)
        finally:
            loader.generator = None

    def __iter__(self) -> Iterator[Any]:
        replay, skip = self._begin()
        gradients = self.gradients
        saved = (gradients.end_of_dataloader, gradients.remainder)
        gradients.end_of_dataloader, gradients.remainder = False, -1
        # try/finally: a loop that breaks (even on the last batch) closes this generator, and
        # the end-of-loader flag must not outlive it (accumulate() and gather_for_metrics
        # would act on it later).
        try:
            iterator = self._start(replay)
            current = next(iterator, _END)
            # Look one batch ahead so the last batch is known while it is being used
            # (accumulate() syncs on it and gather_for_metrics drops its padding).
            while current is not _END:
                upcoming = next(iterator, _END)
                if skip:
                    skip, current = skip - 1, upcoming
                    continue
                if upcoming is _END:
                    gradients.end_of_dataloader = True
                    gradients.remainder = getattr(self._counter, "remainder", -1)
                self.position += 1
                yield current if self.device is None else self._to_device(current)
                current = upcoming
        finally:
            gradients.end_of_dataloader, gradients.remainder = saved

    def _to_device(self, batch: Any) -> Any:
        device, non_blocking = self.device, self.non_blocking
        return apply(lambda t: t.to(device, non_blocking=non_blocking), batch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position in it and the epoch's random draws: enough to resume the order."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "seeds": list(self._randomness.seeds),
            "generator_states": list(self._randomness.states),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` stopped, on the next iteration."""
        self.seed = int(state["seed"])
        for sampler in self._epoch_takers():
            if isinstance(sampler, SeedableRandomSampler):
                sampler.initial_seed = self.seed
        epoch, position = int(state["epoch"]), int(state["position"])
        replay: dict[str, Any] | None = {
            "seeds": state.get("seeds", []),
            "states": state.get("generator_states", []),
        }
        if position == 0:
            replay = None  # saved before the epoch drew anything: draw afresh, as it would
        elif self._sampler is not None and position >= len(self._sampler):
            epoch, position, replay = epoch + 1, 0, None
        self._resume = (epoch, position, replay)

    def skip_first_batches(self, num_batches: int) -> _SkippedLoader:
        """A view whose next iteration starts ``num_batches`` into the coming epoch."""
        return _SkippedLoader(self, num_batches)


class _SkippedLoader:
    """accelerate's ``skip_first_batches`` on a prepared loader: one epoch, its start skipped.

    The epoch is the one the loader would iterate next (after ``load_state``, the saved one,
    with its saved random draws); afterwards the loader itself goes on with the next epoch.
    """

    def __init__(self, loader: DataLoaderShard, num_batches: int) -> None:
        self.loader, self.num_batches = loader, num_batches

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def __len__(self) -> int:
        return max(len(self.loader) - self.num_batches, 0)

    def __iter__(self) -> Iterator[Any]:
        shard = self.loader
        if shard._resume is not None:
            epoch, _, replay = shard._resume
        else:
            epoch, replay = shard.epoch + (1 if shard._iterated else 0), None
        shard._resume = (epoch, self.num_batches, replay if self.num_batches else None)
        yield from shard


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A loader that skips the first ``num_batches`` batches of its next epoch (accelerate's).

    For a prepared loader, the epoch after ``load_state`` is the saved one, so the usual
    resume pattern replays exactly the batches that were left. A plain DataLoader gets a new
    DataLoader with the same dataset and options that skips them.

    Example:
        >>> accelerator.load_state("ckpt")  # doctest: +SKIP
        >>> for batch in skip_first_batches(loader, resume_step):  # doctest: +SKIP
        ...     ...
    """
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ConfigError("num_batches", num_batches, "an int >= 0")
    if isinstance(dataloader, _SkippedLoader):
        dataloader = dataloader.loader
    if isinstance(dataloader, DataLoaderShard):
        return dataloader.skip_first_batches(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise ConfigError("dataloader", type(dataloader).__name__, "a DataLoader")
    if isinstance(dataloader.dataset, IterableDataset):
        return _IterSkip(dataloader, num_batches)
    batches = dataloader.batch_sampler or dataloader.sampler
    skipper = _SkipBatches(batches, num_batches)
    return _rebuild(dataloader, skipper, batches is dataloader.sampler)


class _SkipBatches(Sampler[list[int]]):
    def __init__(self, batches: Any, skip: int) -> None:
        self.batches, self.skip = batches, skip

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batches), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.batches) - self.skip, 0)


class _IterSkip:
    def __init__(self, loader: DataLoader[Any], skip: int) -> None:
        self.loader, self.skip = loader, skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.loader) - self.skip, 0)


def _rebuild(
    source: DataLoader[Any],
    batch_sampler: Sampler[list[int]],
    sampler_is_batch_sampler: bool = False,
    dataset: Any = None,
    batch_size: int | None = None,
) -> DataLoader[Any]:
    """A DataLoader like ``source`` (workers, collate, generator...) over other batches."""
    extra: dict[str, Any] = {}
    if source.num_workers > 0:
        extra = {
            "prefetch_factor": source.prefetch_factor,
            "persistent_workers": source.persistent_workers,
        }
    common: dict[str, Any] = {
        "num_workers": source.num_workers,
        "collate_fn": source.collate_fn,
        "pin_memory": source.pin_memory,
        "timeout": source.timeout,
        "worker_init_fn": source.worker_init_fn,
        "multiprocessing_context": source.multiprocessing_context,
        "generator": source.generator,
        **extra,
    }
    if hasattr(source, "in_order"):  # torch >= 2.6
        common["in_order"] = source.in_order
    if dataset is not None:  # an IterableDataset shard: the loader batches it itself
        return DataLoader(dataset, batch_size=batch_size, drop_last=source.drop_last, **common)
    if sampler_is_batch_sampler:
        # DataLoader(batch_size=None, sampler=BatchSampler(...)): the dataset takes index lists.
        return DataLoader(source.dataset, sampler=batch_sampler, batch_size=None, **common)
    return DataLoader(source.dataset, batch_sampler=batch_sampler, **common)


def _samplers(source: DataLoader[Any]) -> list[Any]:
    """The samplers that decide a loader's order: its sampler, and any inside a batch sampler."""
    found = [source.sampler, getattr(source.sampler, "sampler", None)]
    found.append(getattr(source.batch_sampler, "sampler", None))
    return list({id(s): s for s in found if s is not None}.values())


def _randomness(
    source: DataLoader[Any], samplers: list[Any], state: ProcessState
) -> EpochRandomness:
    """Collect the generators that an epoch draws from (see :class:`EpochRandomness`)."""
    drawn, generators = [], []
    for sampler in samplers:
        if isinstance(sampler, SeedableRandomSampler) or not hasattr(sampler, "generator"):
            continue
        if isinstance(sampler.generator, torch.Generator):
            generators.append(sampler.generator)
        elif sampler.generator is None and (
            isinstance(sampler, RandomSampler) or state.world_size > 1
        ):
            # RandomSampler makes this very draw itself; other samplers (weighted, subset...)
            # would draw from the global RNG in ways that differ per rank, so they get a
            # generator only where ranks must agree.
            drawn.append(sampler)
        seed = getattr(sampler, "seed", None)
        if state.world_size > 1 and isinstance(seed, int) and not isinstance(seed, bool):
            sampler.seed = int(collectives.broadcast_object_list([seed])[0])
    for owner in (source, source.dataset):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            generators.append(generator)
    unique = list({id(g): g for g in generators}.values())
    return EpochRandomness(drawn, unique, state.world_size)


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
        from .data_iterable import shard_iterable_loader

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
    samplers = _samplers(source)
    random = source.sampler if isinstance(source.sampler, RandomSampler) else None
    if config.use_seedable_sampler and random is not None:
        if config.data_seed is not None:
            seed = config.data_seed
        seedable = SeedableRandomSampler(
            random.data_source,
            seed,
            replacement=random.replacement,
            num_samples=random._num_samples,
        )
        batches = BatchSampler(seedable, batch_size or 1, drop_last)
        samplers = [seedable]
    randomness = _randomness(source, samplers, state)
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
    loader = _rebuild(source, shards, sampler_is_batch_sampler)
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
