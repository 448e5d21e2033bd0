"""Data loader sharding: every process sees different batches, in an order all processes agree on.

    user's DataLoader ──> sampler (RandomSampler -> EpochShuffle(seed + epoch), same on every rank)
                     ──> batches of indices ──> rounds: W batches (or 1 batch cut in W pieces
                         with split_batches) ──> ShardSampler yields round[rank]
                     ──> a new DataLoader over the same dataset/collate/workers
                     ──> DataLoaderShard: moves batches to the device, flags the last batch

With ``even_batches`` the last round is completed with samples from the start of the epoch so
every process gets the same number of equally sized batches; ``GradientState.remainder`` then
says how many gathered samples of that round are real, for ``gather_for_metrics``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from .collectives import apply
from .errors import ConfigError
from .state import GradientState, ProcessState

__all__ = ["EpochShuffle", "ShardSampler", "DataLoaderShard", "shard_data_loader"]


class EpochShuffle(Sampler[int]):
    """A permutation drawn from ``seed + epoch``: the same on every rank, new every epoch."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed((self.seed + self.epoch) % 2**63)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


def _chunks(flat: list[int], pieces: int) -> list[list[int]]:
    per, extra = divmod(len(flat), pieces)
    bounds = [k * per + min(k, extra) for k in range(pieces + 1)]
    return [flat[bounds[k] : bounds[k + 1]] for k in range(pieces)]


class ShardSampler(Sampler[list[int]]):
    """Yields this rank's index batches for the current epoch, after ``skip`` rounds."""

    def __init__(
        self,
        batches: Iterable[list[int]],
        world: int,
        rank: int,
        batch_size: int | None,
        split_batches: bool,
        even_batches: bool,
    ) -> None:
        self.batches = batches
        self.world, self.rank = world, rank
        self.batch_size = batch_size
        self.split_batches, self.even_batches = split_batches, even_batches
        self.epoch, self.skip = 0, 0
        self._plan: tuple[int, list[list[list[int]]], int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for source in (self.batches, getattr(self.batches, "sampler", None)):
            if hasattr(source, "epoch"):
                source.epoch = epoch  # type: ignore[union-attr]
            elif hasattr(source, "set_epoch"):
                source.set_epoch(epoch)  # type: ignore[union-attr]

    def rounds(self) -> tuple[list[list[list[int]]], int]:
        """The epoch's rounds (one batch per rank) and the real sample count of the last one."""
        if self._plan is None or self._plan[0] != self.epoch:
            self._plan = (self.epoch, *self._make_rounds())
        return self._plan[1], self._plan[2]

    def _make_rounds(self) -> tuple[list[list[list[int]]], int]:
        batches = [list(b) for b in self.batches]
        size = self.batch_size or (len(batches[0]) if batches else 0)
        if self.split_batches:
            rounds = [_chunks(b, self.world) for b in batches]
            full = size
        else:
            rounds = [batches[i : i + self.world] for i in range(0, len(batches), self.world)]
            full = size * self.world
        # One process needs no padding: it behaves exactly like the plain DataLoader.
        if not rounds or not self.even_batches or self.world == 1:
            return rounds, -1
        last = [i for b in rounds[-1] for i in b]
        real = len(last)
        if real == full and len(rounds[-1]) == self.world:
            return rounds, -1
        # Complete the last round from the start of the epoch (cycling for tiny datasets).
        everything = [i for b in batches for i in b]
        last += list(itertools.islice(itertools.cycle(everything), full - real))
        rounds[-1] = _chunks(last, self.world)
        return rounds, real

    def __iter__(self) -> Iterator[list[int]]:
        rounds, _ = self.rounds()
        for round_ in rounds[self.skip :]:
            if self.rank < len(round_) and round_[self.rank]:
                yield round_[self.rank]

    def __len__(self) -> int:
        rounds, _ = self.rounds()
        return sum(1 for r in rounds if self.rank < len(r) and r[self.rank])


_END = object()


class DataLoaderShard:
    """This process's view of a prepared DataLoader: its batches, on its device.

    Iterating again starts the next epoch (a new, seeded shuffle); ``set_epoch`` picks one.
    ``state_dict``/``load_state_dict`` carry the epoch and position for resuming mid-epoch.

    Example:
        >>> loader = accelerator.prepare(DataLoader(dataset, batch_size=8, shuffle=True))
        >>> for x, y in loader:  # this rank's batches, already on accelerator.device
        ...     pass
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        source: DataLoader[Any],
        sampler: ShardSampler | None,
        seed: int,
        device: torch.device | None,
        gradients: GradientState,
        private_generator: torch.Generator | None = None,
    ) -> None:
        self._loader, self._source, self._sampler = loader, source, sampler
        self._generator = private_generator
        self.seed = seed
        self.device = device if device is not None and device.type != "cpu" else None
        self.gradients = gradients
        self.epoch = 0
        self.position = 0  # batches this rank has yielded in ``epoch``
        self._iterated = False
        self._resume: tuple[int, int] | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "_source" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_source"], name)

    def __len__(self) -> int:
        return len(self._loader)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s shuffle for the next iteration."""
        self._resume = (epoch, 0)

    def _begin(self) -> None:
        epoch, skip = self._resume or (self.epoch + (1 if self._iterated else 0), 0)
        self._resume, self._iterated = None, True
        self.epoch, self.position = epoch, skip
        if self._generator is not None:
            self._generator.manual_seed((self.seed + epoch) % 2**63)
        if self._sampler is not None:
            self._sampler.set_epoch(epoch)
            self._sampler.skip = skip

    def __iter__(self) -> Iterator[Any]:
        self._begin()
        saved = (self.gradients.end_of_dataloader, self.gradients.remainder)
        self.gradients.end_of_dataloader, self.gradients.remainder = False, -1
        remainder = self._sampler.rounds()[1] if self._sampler is not None else -1
        iterator = iter(self._loader)
        current = next(iterator, _END)
        # Look one batch ahead so the last batch is known while it is being used
        # (accumulate() syncs on it and gather_for_metrics drops its padding).
        while current is not _END:
            upcoming = next(iterator, _END)
            if upcoming is _END:
                self.gradients.end_of_dataloader, self.gradients.remainder = True, remainder
            self.position += 1
            yield current if self.device is None else self._to_device(current)
            current = upcoming
        self.gradients.end_of_dataloader, self.gradients.remainder = saved

    def _to_device(self, batch: Any) -> Any:
        device = self.device
        return apply(lambda t: t.to(device, non_blocking=True), batch)

    def state_dict(self) -> dict[str, int]:
        """Epoch, position in it, and shuffle seed: enough to resume the exact data order."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where ``state`` stopped, on the next iteration."""
        self.seed = int(state["seed"])
        shuffle = getattr(self._sampler.batches, "sampler", None) if self._sampler else None
        if isinstance(shuffle, EpochShuffle):
            shuffle.seed = self.seed
        epoch, position = int(state["epoch"]), int(state["position"])
        if self._sampler is not None:
            self._sampler.set_epoch(epoch)
            self._sampler.skip = 0
            if position >= len(self._sampler):
                epoch, position = epoch + 1, 0
        self._resume = (epoch, position)


def _rebuild(
    source: DataLoader[Any], batch_sampler: Sampler[list[int]], generator: torch.Generator | None
) -> DataLoader[Any]:
    extra: dict[str, Any] = {}
    if source.num_workers > 0:
        extra = {
            "prefetch_factor": source.prefetch_factor,
            "persistent_workers": source.persistent_workers,
        }
    return DataLoader(
        source.dataset,
        batch_sampler=batch_sampler,
        num_workers=source.num_workers,
        collate_fn=source.collate_fn,
        pin_memory=source.pin_memory,
        timeout=source.timeout,
        worker_init_fn=source.worker_init_fn,
        multiprocessing_context=source.multiprocessing_context,
        generator=generator,
        **extra,
    )


def shard_data_loader(
    source: DataLoader[Any],
    state: ProcessState,
    gradients: GradientState,
    seed: int,
    split_batches: bool = False,
    even_batches: bool = True,
    device_placement: bool = True,
) -> DataLoaderShard:
    """Wrap ``source`` so this process iterates its own shard (see the module docstring).

    Raises:
        ConfigError: ``split_batches`` with a batch size the process count does not divide,
            or an IterableDataset (sharding one needs its own split; not supported yet).
    """
    if isinstance(source.dataset, IterableDataset):
        raise ConfigError(
            "prepare(DataLoader(IterableDataset))",
            type(source.dataset).__name__,
            "a DataLoader over a map-style dataset",
            "Split the stream per rank yourself (accelerator.process_index) and do not prepare it.",
        )
    if split_batches and source.batch_size is not None and source.batch_size % state.world_size:
        raise ConfigError(
            "split_batches",
            True,
            f"a batch_size divisible by num_processes={state.world_size}",
            f"The loader's batch_size is {source.batch_size}.",
        )
    if source.batch_sampler is None:
        raise ConfigError(
            "DataLoader(batch_size=None)", None, "a loader that batches (batch_size >= 1)"
        )
    batches: Iterable[list[int]] = source.batch_sampler
    sampler = source.sampler
    if isinstance(sampler, RandomSampler) and not sampler.replacement:
        if sampler.generator is not None:
            seed = sampler.generator.initial_seed()
        shuffle = EpochShuffle(len(sampler.data_source), seed)
        batches = BatchSampler(shuffle, source.batch_size or 1, source.drop_last)
    shards = ShardSampler(
        batches,
        state.world_size,
        state.rank,
        source.batch_size,
        split_batches,
        even_batches,
    )
    # Starting an iterator draws a seed for the loader's workers; from a private generator
    # (reseeded every epoch) that draw leaves the global RNG alone, so a resumed run that
    # starts its iterator mid-epoch draws the same random numbers as the uninterrupted one.
    private = torch.Generator() if source.generator is None else None
    loader = _rebuild(source, shards, private or source.generator)
    device = state.device if device_placement else None
    return DataLoaderShard(loader, source, shards, seed, device, gradients, private)
