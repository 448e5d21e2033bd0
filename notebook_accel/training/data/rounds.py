"""Rounds: which of an epoch's batches each rank takes (accelerate's BatchSamplerShard rules).

    batches b0 b1 b2 b3 b4 ──> rounds [b0 b1] [b2 b3] [b4 +pad]   (W = 2; rank r takes piece r)
    split_batches:              [b0/2 b0/2] [b1/2 b1/2] ...        (each batch cut in W)

The short last round is completed from the epoch's start (``even_batches``), left short, or
dropped (the batch sampler's ``drop_last``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from torch.utils.data import Sampler

from .randomness import EpochRandomness

__all__ = ["plan_rounds", "ShardSampler"]


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
