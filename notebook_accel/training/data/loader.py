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
through ``iterable.py`` instead (the main process dispatches, or each rank keeps its part).

With ``even_batches`` the last round is completed with samples from the start of the epoch so
every process gets the same number of equally sized batches; ``GradientState.remainder`` then
says how many gathered samples of that round are real, for ``gather_for_metrics``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from ...errors import ConfigError
from ..collectives import apply
from ..process import GradientState
from .randomness import EpochRandomness, SeedableRandomSampler, samplers_of
from .rounds import ShardSampler, plan_rounds

__all__ = [
    "SeedableRandomSampler",
    "EpochRandomness",
    "plan_rounds",
    "ShardSampler",
    "DataLoaderShard",
    "rebuild",
    "iter_without_base_seed",
    "skip_first_batches",
]


_END = object()


class DataLoaderShard:
    """This process's view of a prepared DataLoader: its batches, on its device.

    Iterating again after a complete pass starts the next epoch (after a loop that broke, the same
    epoch number again, as in accelerate); ``set_epoch`` picks the epoch number passed on to
    samplers and datasets that have ``set_epoch``. ``state_dict``/``load_state_dict`` carry the
    epoch, the position in it and the epoch's random draws, for resuming mid-epoch (what
    torchdata's ``StatefulDataLoader`` offers, which accelerate's
    ``use_stateful_dataloader=True`` adds; here always).

    Example:
        >>> loader = accelerator.prepare(DataLoader(dataset, batch_size=8, shuffle=True))
        >>> for x, y in loader:  # this rank's batches, already on accelerator.device
        ...     pass
    """

    use_stateful_dataloader = False  # DataLoaderConfiguration's flag, for accelerate's code

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
        takers: list[Any] | None = None,
    ) -> None:
        self._loader, self._source, self._sampler = loader, source, sampler
        # What knows the last round's real sample count (``remainder``) once it was planned.
        self._counter = sampler if sampler is not None else counter
        self._randomness = randomness
        self._takers = takers or []  # more objects whose set_epoch gets the epoch
        self.seed = seed  # of use_seedable_sampler
        self.device = device if device is not None and device.type != "cpu" else None
        self.gradients = gradients
        self.non_blocking = non_blocking
        self._world, self._split = world, split_batches
        self.epoch = 0
        self.position = 0  # batches this rank has yielded in ``epoch``
        # Whether the last iteration ran to its end: only then is the next one a new epoch
        # (accelerate's ``iteration``; a loop that breaks keeps the epoch's number).
        self._finished = False
        self._resume: tuple[int, int, dict[str, Any] | None] | None = None
        # Accelerator(rng_types=["torch", ...]): makes every rank's generators equal to rank 0's
        # at the start of each iteration, as accelerate does.
        self.synchronize_rng: Callable[[], None] | None = None

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
        fresh = (self.epoch + (1 if self._finished else 0), 0, None)
        epoch, skip, replay = self._resume or fresh
        self._resume, self._finished = None, False
        self.epoch, self.position = epoch, skip
        for target in self._epoch_takers():
            target.set_epoch(epoch)
        if self._sampler is not None:
            self._sampler.skip = skip
            return replay, 0
        return replay, skip

    def _epoch_takers(self) -> list[Any]:
        """The samplers and dataset that have ``set_epoch``, ours included."""
        targets: list[Any] = [self._source.dataset, *samplers_of(self._source), *self._takers]
        if self._sampler is not None:
            targets.append(getattr(self._sampler.batches, "sampler", None))
        return list({id(t): t for t in targets if hasattr(t, "set_epoch")}.values())

    def _start(self, replay: dict[str, Any] | None) -> Iterator[Any]:
        self._randomness.begin_epoch(replay)
        # A resumed epoch must not draw the workers' base seed from the global RNG again
        # (the uninterrupted run drew it at the epoch's start, before the checkpoint).
        if replay is None:
            return iter(self._loader)
        if isinstance(self._loader, DataLoader):
            return iter_without_base_seed(self._loader)
        return self._loader.resumed_epoch()

    def __iter__(self) -> Iterator[Any]:
        if self.synchronize_rng is not None:
            self.synchronize_rng()
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
            self._finished = True
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
            "generator_states_now": self._randomness.current_states(),
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
        elif position >= self._length():
            epoch, position, replay = epoch + 1, 0, None
        # Where the generators were at the save (a next epoch goes on from there; a resumed
        # one replays its start's states instead).
        self._randomness.restore_current(list(state.get("generator_states_now", [])))
        self._resume = (epoch, position, replay)

    def _length(self) -> float:
        """This rank's batches per epoch (infinite when the loader cannot tell)."""
        try:
            return len(self._sampler if self._sampler is not None else self._loader)
        except TypeError:
            return float("inf")

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
            epoch, replay = shard.epoch + (1 if shard._finished else 0), None
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
    return rebuild(dataloader, skipper, batches is dataloader.sampler)


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


def iter_without_base_seed(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)`` without the base-seed draw from the global RNG (a resumed epoch)."""
    if loader.generator is not None:
        return iter(loader)
    loader.generator = torch.Generator()
    try:
        return iter(loader)
    finally:
        loader.generator = None


def rebuild(
    source: DataLoader[Any],
    batch_sampler: Sampler[list[int]] | None,
    sampler_is_batch_sampler: bool = False,
    dataset: Any = None,
    batch_size: int | None = None,
    keep_generator: bool = True,
) -> DataLoader[Any]:
    """A DataLoader like ``source`` (workers, collate, generator...) over other batches.

    ``keep_generator=False`` leaves out the loader's ``generator`` (a dispatching loader's base
    seed comes from the global RNG, as accelerate's does).
    """
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
        "generator": source.generator if keep_generator else None,
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
