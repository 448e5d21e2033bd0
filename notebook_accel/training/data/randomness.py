"""The random draws behind a loader's order: taken when accelerate takes them, replayable.

    sampler with a generator (the user's) ──> rank 0's state sent to all, per epoch
    RandomSampler without one, one process ──> each epoch, one draw from the global RNG seeds it
    (or dispatch: the main process only)       (the very draw RandomSampler makes itself, at the
                                               epoch's first batch, after DataLoader's base seed)
    any sampler without one, several processes ──> at ``prepare``, one draw from the global RNG
    (no dispatch, no seedable sampler)            seeds a generator it keeps (accelerate's
                                                  ``prepare_data_loader``); then as above
    use_seedable_sampler ──> SeedableRandomSampler: the permutation of seed + epoch

Every epoch's draws and generator states are recorded, so a checkpoint can replay an epoch
without drawing again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from .. import collectives

__all__ = [
    "SeedableRandomSampler",
    "EpochRandomness",
    "samplers_of",
    "epoch_randomness",
    "main_sampler",
    "seed_at_prepare",
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

    Two kinds of source: ``generators`` (the user's, or the one :func:`seed_at_prepare` gave a
    sampler): rank 0's state is sent to all at each epoch start, as accelerate does; and
    ``drawn`` samplers (a generator-less RandomSampler on one process, or on the main process
    of a dispatching loader): each epoch they get a generator seeded by a draw from the global
    RNG, exactly RandomSampler's own draw at the same moment. ``seeds``/``states`` are the
    current epoch's, saved by checkpoints; :meth:`begin_epoch` with a ``replay`` restores them
    instead of drawing (a resumed epoch draws nothing).
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

    def current_states(self) -> list[torch.Tensor]:
        """The generators' states now (mid-epoch or after it), for a checkpoint."""
        return [g.get_state() for g in self.generators]

    def restore_current(self, states: list[torch.Tensor]) -> None:
        """Put back :meth:`current_states` (ignored when made for other generators)."""
        if len(states) == len(self.generators):
            for generator, state in zip(self.generators, states, strict=True):
                generator.set_state(state)

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


def samplers_of(source: DataLoader[Any]) -> list[Any]:
    """The samplers that decide a loader's order: its sampler, and any inside a batch sampler."""
    found = [source.sampler, getattr(source.sampler, "sampler", None)]
    found.append(getattr(source.batch_sampler, "sampler", None))
    return list({id(s): s for s in found if s is not None}.values())


def main_sampler(source: DataLoader[Any]) -> Any:
    """The sampler inside the loader's batch sampler (accelerate's ``get_sampler``)."""
    holder = source.sampler if isinstance(source.sampler, BatchSampler) else source.batch_sampler
    return getattr(holder, "sampler", None)


def seed_at_prepare(sampler: Any) -> None:
    """Give a generator-less sampler a generator seeded by one global draw, now and for good.

    What accelerate's ``prepare_data_loader`` does on several processes without dispatch (the
    user's sampler keeps it): ``set_seed`` after ``prepare`` no longer changes the shuffle.
    """
    if hasattr(sampler, "generator") and sampler.generator is None:
        generator = torch.Generator()
        sampler.generator = generator.manual_seed(_draw_seed())


def epoch_randomness(
    source: DataLoader[Any], samplers: list[Any], world: int, loader_generator: bool = True
) -> EpochRandomness:
    """Collect the generators that an epoch draws from (see :class:`EpochRandomness`).

    ``world`` is the number of processes that read the samplers (1 when the main process
    dispatches); ``loader_generator``: whether the loader's own ``generator`` is used (it is
    not when dispatching: the base seed then comes from the global RNG, as in accelerate).
    """
    drawn, generators = [], []
    for sampler in samplers:
        seed = getattr(sampler, "seed", None)
        if world > 1 and isinstance(seed, int) and not isinstance(seed, bool):
            # A sampler seeded per rank (DistributedSampler's kind): every rank takes rank 0's.
            sampler.seed = int(collectives.broadcast_object_list([seed])[0])
        if isinstance(sampler, SeedableRandomSampler) or not hasattr(sampler, "generator"):
            continue
        if isinstance(sampler.generator, torch.Generator):
            generators.append(sampler.generator)
        elif sampler.generator is None and isinstance(sampler, RandomSampler) and world == 1:
            # The draw RandomSampler makes itself, recorded so that a resumed epoch replays it.
            # Other generator-less samplers (weighted, subset...) draw as they please, as they
            # do in accelerate.
            drawn.append(sampler)
    for owner in (source, source.dataset) if loader_generator else (source.dataset,):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            generators.append(generator)
    unique = list({id(g): g for g in generators}.values())
    return EpochRandomness(drawn, unique, world)
