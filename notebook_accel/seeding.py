"""Seeding python's ``random``, numpy and torch: a launch's ``seed=`` and ``set_seed()``.

The workers of a launch seed with these before the function runs (fresh entropy, or the
launch's seed); keeping generators in step across ranks is the loaders' job
(``training/data/rng.py``).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["set_seed", "fresh_seeds"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python's ``random``, numpy and torch (every CUDA device too).

    Args:
        seed: the seed.
        device_specific: add the process index to ``seed`` so every rank draws differently
            (dropout masks, augmentations), while the run stays reproducible.
        deterministic: also make torch use deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``, as accelerate's).

    Example:
        >>> from notebook_accel import set_seed
        >>> set_seed(42)
    """
    if device_specific:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            seed += dist.get_rank()
    random.seed(seed)
    # numpy only takes 32-bit seeds.
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily
    if deterministic:
        torch.use_deterministic_algorithms(True)


def fresh_seeds() -> None:
    """Seed python's ``random``, numpy and torch from the operating system's entropy.

    A launch's workers are forked from one forkserver and would otherwise all start from its
    generator states: the same ``torch.rand`` on every rank and in every launch. torchrun's
    processes start fresh; so do ours, unless a seed was asked for.
    """
    random.seed(int.from_bytes(os.urandom(8), "little"))
    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # torch takes < 2**63
