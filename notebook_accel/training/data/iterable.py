"""IterableDataset loaders across processes, in accelerate's two ways.

    dispatch (the default for an IterableDataset, as in accelerate; a map-style dataset with
    DataLoaderConfiguration(dispatch_batches=True) too):
        rank 0 iterates a copy of the user's DataLoader without its ``generator``; per round it
        takes W batches (1 batch with split_batches), cuts the round into W equal pieces and
        scatters them; the other ranks only receive. A short last round is cut evenly,
        completed from the stream's first samples (gather_for_metrics drops those), or dropped
        with drop_last=True. Every rank draws the DataLoader's base seed from the global RNG at
        each epoch's start, as accelerate's do (they all create the iterator).
    per rank (DataLoaderConfiguration(dispatch_batches=False)):
        every rank reads the whole stream through IterableShard, which keeps this rank's slice
        of each global batch, and batches it with the loader's own options.

Both end up inside a ``DataLoaderShard`` (loader.py), which places batches and flags the last.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from ..process import GradientState, ProcessState
from .config import DataLoaderConfiguration
from .loader import DataLoaderShard, iter_without_base_seed, rebuild
from .randomness import EpochRandomness

__all__ = ["IterableShard", "Dispatcher", "shard_iterable_loader"]


class IterableShard(IterableDataset[Any]):
    """This rank's elements of an iterable dataset: its slice of every global batch.

    A global batch is ``batch_size * world`` elements (``batch_size`` with split_batches);
    rank ``r`` keeps its ``r``-th part. The last global batch is completed from the first one,
    or dropped with ``drop_last``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        drop_last: bool,
        world: int,
        rank: int,
        split_batches: bool,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size or 1
        self.drop_last = drop_last
        self.world, self.rank = world, rank
        self.split_batches = split_batches
        self.remainder = -1  # real elements in the last global batch, when it was completed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Number the next iteration (the prepared loader passes it to the dataset itself)."""
        self.epoch = epoch

    def __len__(self) -> int:
        whole = self.batch_size if self.split_batches else self.batch_size * self.world
        per = whole // self.world
        rounds = len(self.dataset) / whole
        return (math.floor(rounds) if self.drop_last else math.ceil(rounds)) * per

    def __iter__(self) -> Iterator[Any]:
        whole = self.batch_size if self.split_batches else self.batch_size * self.world
        per = whole // self.world
        mine = slice(self.rank * per, (self.rank + 1) * per)
        generator = getattr(self.dataset, "generator", None)
        if isinstance(generator, torch.Generator) and not hasattr(self.dataset, "set_epoch"):
            generator.manual_seed(self.epoch)  # accelerate's IterableDatasetShard does this
        self.remainder = -1
        first: list[Any] | None = None
        current: list[Any] = []
        for element in self.dataset:
            current.append(element)
            if len(current) == whole:
                yield from current[mine]
                first = first or current
                current = []
        if current and not self.drop_last:
            self.remainder = len(current)
            current += list(itertools.islice(itertools.cycle(first or current), whole))
            yield from current[:whole][mine]


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch:
        return _batch_len(batch[0])
    raise TypeError(
        f"A dispatched batch must be made of tensors (nested in lists, tuples or dicts) to be "
        f"cut across processes; got {type(batch).__name__}. Use "
        "DataLoaderConfiguration(dispatch_batches=False) to let each process read its own part."
    )


def _concat(batches: list[Any]) -> Any:
    head = batches[0]
    if isinstance(head, torch.Tensor):
        return torch.cat([b if b.ndim else b[None] for b in batches])
    if isinstance(head, dict):
        return type(head)({k: _concat([b[k] for b in batches]) for k in head})
    if isinstance(head, tuple) and hasattr(head, "_fields"):
        return type(head)(*(_concat(list(parts)) for parts in zip(*batches, strict=True)))
    if isinstance(head, list | tuple):
        return type(head)(_concat(list(parts)) for parts in zip(*batches, strict=True))
    _batch_len(head)  # raises the TypeError that explains what is accepted
    return head


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return type(batch)({k: _slice(v, start, stop) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_slice(v, start, stop) for v in batch))
    return type(batch)(_slice(v, start, stop) for v in batch)


class Dispatcher:
    """Rank 0 reads the user's loader and sends every rank its piece of each round."""

    def __init__(
        self, source: DataLoader[Any], state: ProcessState, split_batches: bool, drop_last: bool
    ) -> None:
        self.source, self.state, self.split_batches = source, state, split_batches
        self.drop_last = drop_last  # the user's loader's (its batch sampler drops by itself)
        self.remainder = -1

    def __len__(self) -> int:
        batches, world = len(self.source), self.state.world_size
        if self.split_batches:
            return batches
        return batches // world if self.drop_last else math.ceil(batches / world)

    def _round(self, iterator: Iterator[Any], size: list[int], first: list[Any]) -> Any:
        """Rank 0: this round's W pieces and the real sample count if it was completed."""
        world = self.state.world_size
        batches = list(itertools.islice(iterator, 1 if self.split_batches else world))
        if not batches:
            return None
        lengths = [_batch_len(b) for b in batches]
        if not size:
            size.append(lengths[0])
            first.append(_concat(batches))
        wanted = 1 if self.split_batches else world
        if len(batches) == wanted and all(n == size[0] for n in lengths):
            if not self.split_batches:
                return batches, -1
            per = size[0] // world
            return [_slice(batches[0], k * per, (k + 1) * per) for k in range(world)], -1
        # The stream's short end: cut evenly, completing from the first round if needed.
        if self.drop_last:
            return None
        real = sum(lengths)
        per = math.ceil(real / world)
        whole = _concat(batches + [first[0]] * math.ceil((per * world - real) / size[0]))
        pieces = [_slice(whole, k * per, (k + 1) * per) for k in range(world)]
        return pieces, (real if per * world > real else -1)

    def __iter__(self) -> Iterator[Any]:
        return self._epoch(draw_base_seed=True)

    def resumed_epoch(self) -> Iterator[Any]:
        """An epoch resumed from a checkpoint: its base seed was drawn before the save."""
        return self._epoch(draw_base_seed=False)

    def _epoch(self, draw_base_seed: bool) -> Iterator[Any]:
        main = self.state.rank == 0
        iterator: Iterator[Any] = iter(())
        if main:
            iterator = iter(self.source) if draw_base_seed else iter_without_base_seed(self.source)
        elif draw_base_seed:
            # What creating the (unused) iterator of a generator-less DataLoader draws.
            torch.empty((), dtype=torch.int64).random_()
        size: list[int] = []
        first: list[Any] = []
        self.remainder = -1
        done = False
        while not done:
            outgoing: list[Any] | None = None
            if main:
                planned = None if done else self._round(iterator, size, first)
                if planned is None:
                    outgoing = [(None, -1, True)] * self.state.world_size
                else:
                    outgoing = [(piece, planned[1], False) for piece in planned[0]]
            received: list[Any] = [None]
            dist.scatter_object_list(received, outgoing, src=0)
            piece, real, done = received[0]
            if done:
                return
            if real >= 0:
                self.remainder = real
            yield piece


def shard_iterable_loader(
    source: DataLoader[Any],
    state: ProcessState,
    gradients: GradientState,
    config: DataLoaderConfiguration,
    device: torch.device | None,
    batch_size: int | None,
) -> Any:
    """The ``DataLoaderShard`` of a loader over an ``IterableDataset``."""

    dispatch = config.dispatch_batches
    if dispatch is None:
        dispatch = device is not None  # accelerate: dispatch when batches go to the device
    generators: list[torch.Generator] = []
    loader: Any = source
    counter: Any = None
    takers: list[Any] = []
    if dispatch:
        # accelerate's dispatching loader has no generator, on one process too.
        loader = rebuild(
            source, None, dataset=source.dataset, batch_size=batch_size, keep_generator=False
        )
        if state.world_size > 1:
            loader = counter = Dispatcher(loader, state, config.split_batches, source.drop_last)
    elif state.world_size > 1:
        shard = IterableShard(
            source.dataset,
            batch_size,
            source.drop_last,
            state.world_size,
            state.rank,
            config.split_batches,
        )
        per_rank = batch_size // state.world_size if config.split_batches and batch_size else None
        loader = rebuild(source, None, dataset=shard, batch_size=per_rank or batch_size)
        counter = shard
        takers.append(shard)
        generator = getattr(source.dataset, "generator", None)
        if isinstance(generator, torch.Generator):
            generators.append(generator)  # each rank reads the stream: it must be the same
    randomness = EpochRandomness([], generators, state.world_size)
    return DataLoaderShard(
        loader,
        source,
        None,
        randomness,
        0,
        device,
        gradients,
        non_blocking=config.non_blocking,
        world=state.world_size,
        split_batches=config.split_batches,
        counter=counter,
        takers=takers,
    )
