"""A seed chosen at launch seeds every rank's RNGs when the Accelerator starts."""

from __future__ import annotations

from notebook_accel import notebook_launcher


def _draw() -> list[float]:
    import random

    import torch

    from notebook_accel import Accelerator

    Accelerator()
    return [random.random(), torch.rand(1).item()]


def test_launch_seed_seeds_every_rank_the_same_way() -> None:
    first = notebook_launcher(_draw, num_processes=2, hardware="cpu", seed=5)
    again = notebook_launcher(_draw, num_processes=2, hardware="cpu", seed=5)
    other = notebook_launcher(_draw, num_processes=2, hardware="cpu", seed=6)
    assert first[0] == first[1] == again[0]
    assert other[0] != first[0]
