"""The random draws behind a loader's order, kept equal on every rank and replayable.

    sampler with the user's generator ──> rank 0's generator state sent to all, per epoch
    sampler without one (RandomSampler) ──> rank 0's draw from the global RNG seeds it, per
                                            epoch (the very draw RandomSampler makes itself)
    use_seedable_sampler ──> SeedableRandomSampler: the permutation of seed + epoch

Both kinds are recorded per epoch, so a checkpoint can replay an epoch without drawing again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from .. import collectives
from ..state import ProcessState

__all__ = ["SeedableRandomSampler", "EpochRandomness", "samplers_of", "epoch_randomness"]


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


def samplers_of(source: DataLoader[Any]) -> list[Any]:
    """The samplers that decide a loader's order: its sampler, and any inside a batch sampler."""
    found = [source.sampler, getattr(source.sampler, "sampler", None)]
    found.append(getattr(source.batch_sampler, "sampler", None))
    return list({id(s): s for s in found if s is not None}.values())


def epoch_randomness(
    source: DataLoader[Any], samplers: list[Any], state: ProcessState
) -> EpochRandomness:
    """Collect the generators that an epoch draws from (see :class:`EpochRandomness`)."""
    drawn, generators = [], []
    for sampler in samplers:
        seed = getattr(sampler, "seed", None)
        if state.world_size > 1 and isinstance(seed, int) and not isinstance(seed, bool):
            # A sampler seeded per rank (DistributedSampler's kind): every rank takes rank 0's.
            sampler.seed = int(collectives.broadcast_object_list([seed])[0])
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
    for owner in (source, source.dataset):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            generators.append(generator)
    unique = list({id(g): g for g in generators}.values())
    return EpochRandomness(drawn, unique, state.world_size)
