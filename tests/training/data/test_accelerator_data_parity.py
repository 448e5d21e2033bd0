"""Prepared loaders against HF accelerate's, on 2 real processes: the same batches per rank.

Runs where accelerate is installed (it is the peer we port from); each library in its own
launch with the same function, only the import differing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from notebook_accel import debug_launcher

pytest.importorskip("accelerate")


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def _batches(library: str) -> dict:
    if library == "accelerate":
        from accelerate import Accelerator, DataLoaderConfiguration
    else:
        from notebook_accel import Accelerator, DataLoaderConfiguration  # type: ignore[assignment]

    def make(**options: Any) -> Any:
        config = DataLoaderConfiguration(**options)
        return Accelerator(cpu=True, dataloader_config=config)  # type: ignore[arg-type]

    def epoch(acc: Any, loader: Any) -> list:
        return [b.tolist() for b in acc.prepare(loader)]

    acc, per_rank = make(), make(dispatch_batches=False)
    split, uneven = make(split_batches=True), make(even_batches=False)
    out = {
        "stream10": epoch(acc, DataLoader(Stream(10), batch_size=2)),
        "stream11": epoch(acc, DataLoader(Stream(11), batch_size=2)),
        "stream13_b3": epoch(acc, DataLoader(Stream(13), batch_size=3)),
        "stream_drop": epoch(acc, DataLoader(Stream(11), batch_size=2, drop_last=True)),
        "stream_per_rank": epoch(per_rank, DataLoader(Stream(11), batch_size=3)),
        "stream_split": epoch(split, DataLoader(Stream(10), batch_size=4)),
        "map9": epoch(acc, DataLoader(range(9), batch_size=2)),
        "map7_b3": epoch(acc, DataLoader(range(7), batch_size=3)),
        "map_drop": epoch(acc, DataLoader(range(10), batch_size=2, drop_last=True)),
        "map_split": epoch(split, DataLoader(range(9), batch_size=4)),
        "map_uneven": epoch(uneven, DataLoader(range(9), batch_size=2)),
    }
    # A user's generator, re-seeded after prepare: the same shuffle as accelerate's.
    generator = torch.Generator()
    shuffled = acc.prepare(DataLoader(range(24), batch_size=2, shuffle=True, generator=generator))
    inside = RandomSampler(range(24), generator=generator)
    in_batch_sampler = acc.prepare(
        DataLoader(range(24), batch_sampler=BatchSampler(inside, 3, False), generator=generator)
    )
    generator.manual_seed(42)
    for name, loader in (("shuffled", shuffled), ("in_batch_sampler", in_batch_sampler)):
        out[name] = [[b.tolist() for b in loader] for _ in range(2)]
    return out


def test_same_batches_as_accelerate() -> None:
    theirs = debug_launcher(_batches, args=("accelerate",), num_processes=2)
    ours = debug_launcher(_batches, args=("notebook_accel",), num_processes=2)
    for rank in range(2):
        for name, expected in theirs[rank].items():
            assert ours[rank][name] == expected, (rank, name)
