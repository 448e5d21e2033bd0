"""Each worker of each launch draws its own random numbers, unless a seed was asked for."""

from __future__ import annotations

from notebook_accel import debug_launcher


def _draws() -> tuple[float, float, float]:
    import random

    import numpy as np
    import torch

    return torch.rand(1).item(), float(np.random.rand()), random.random()


def test_unseeded_workers_differ_across_ranks_and_launches() -> None:
    first = debug_launcher(_draws, num_processes=2)
    second = debug_launcher(_draws, num_processes=2)
    for library in range(3):  # torch, numpy, random
        values = [draws[library] for draws in first + second]
        assert len(set(values)) == 4, (library, values)


def test_a_launch_seed_repeats_on_every_rank_and_launch() -> None:
    first = debug_launcher(_draws, num_processes=2, seed=7)
    second = debug_launcher(_draws, num_processes=2, seed=7)
    assert first[0] == first[1] == second[0] == second[1]


def test_set_seed_in_the_function_still_decides() -> None:
    def seeded() -> tuple[float, float, float]:
        from notebook_accel import set_seed

        set_seed(3)
        return _draws()

    assert len(set(debug_launcher(seeded, num_processes=2))) == 1
