"""Keeping generators in step across ranks (``Accelerator(rng_types=...)``).

Checkpoints save and restore the generators' states in accelerate's format
(``checkpoint/files.py``'s ``rng_file_state``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["RNG_TYPES", "synchronize_rng_states"]


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
