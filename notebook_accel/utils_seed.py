"""Seeding, and keeping generators in step across ranks (``Accelerator(rng_types=...)``).

Checkpoints save and restore the generators' states in accelerate's format
(``serialization.rng_file_state``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

__all__ = ["set_seed", "fresh_seeds", "RNG_TYPES", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False) -> None:
    """Seed python's ``random``, numpy and torch (every CUDA device too).

    Args:
        seed: the seed.
        device_specific: add the process index to ``seed`` so every rank draws differently
            (dropout masks, augmentations), while the run stays reproducible.

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


def fresh_seeds() -> None:
    """Seed python's ``random``, numpy and torch from the operating system's entropy.

    A launch's workers are forked from one forkserver and would otherwise all start from its
    generator states: the same ``torch.rand`` on every rank and in every launch. torchrun's
    processes start fresh; so do ours, unless a seed was asked for.
    """
    random.seed(int.from_bytes(os.urandom(8), "little"))
    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # torch takes < 2**63


# accelerate's rng_types: "generator" is the shuffle's own generator (ours is always seeded
# alike on every rank); the others are process-wide generators.
RNG_TYPES = ("torch", "cuda", "xla", "generator")


def synchronize_rng_states(rng_types: list[str]) -> None:
    """Give every rank rank 0's torch / CUDA / XLA generator state (a collective call).

    Args:
        rng_types: names from :data:`RNG_TYPES`; ``"generator"`` needs nothing here.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    states: list[Any] = [None, None, None]
    if dist.get_rank() == 0:
        if "torch" in rng_types:
            states[0] = torch.get_rng_state()
        if "cuda" in rng_types and torch.cuda.is_available():
            states[1] = torch.cuda.get_rng_state()
        if "xla" in rng_types:
            import torch_xla.core.xla_model as xm

            states[2] = xm.get_rng_state()
    if not any(name in rng_types for name in ("torch", "cuda", "xla")):
        return
    dist.broadcast_object_list(states, src=0)
    if states[0] is not None:
        torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1])
    if states[2] is not None:
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(states[2])
