"""Keeping generators in step across ranks (``Accelerator(rng_types=...)``).

Checkpoints save and restore the generators' states in accelerate's format
(``checkpoint/files.py``'s ``rng_file_state``).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

__all__ = ["RNG_TYPES", "RNGType", "synchronize_rng_state", "synchronize_rng_states"]


class RNGType(enum.StrEnum):
    """accelerate's generator names (members compare equal to the strings); the ones this
    package keeps in step are :data:`RNG_TYPES`'s, the others name devices it does not run."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


# accelerate's rng_types: "generator" is the shuffle's own generator (ours is always seeded
# alike on every rank); the others are process-wide generators.
RNG_TYPES = ("torch", "cuda", "xla", "generator")


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None = None) -> None:
    """Give every rank rank 0's torch / CUDA / XLA generator state (a collective call).

    Args:
        rng_types: names from :data:`RNG_TYPES` (or :class:`RNGType` members).
        generator: with ``"generator"`` in ``rng_types``, this generator takes rank 0's state
            too (a prepared loader's shuffle needs nothing: every rank seeds it alike).

    Example:
        >>> synchronize_rng_states(["torch"])  # every rank: rank 0's torch state  # doctest: +SKIP
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    states: list[Any] = [None, None, None, None]
    own = generator if "generator" in rng_types else None
    if dist.get_rank() == 0:
        if own is not None:
            states[3] = own.get_state()
        if "torch" in rng_types:
            states[0] = torch.get_rng_state()
        if "cuda" in rng_types and torch.cuda.is_available():
            states[1] = torch.cuda.get_rng_state()
        if "xla" in rng_types:
            import torch_xla.core.xla_model as xm

            states[2] = xm.get_rng_state()
    if own is None and not any(name in rng_types for name in ("torch", "cuda", "xla")):
        return
    dist.broadcast_object_list(states, src=0)
    if states[0] is not None:
        torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1])
    if own is not None and states[3] is not None:
        own.set_state(states[3])
    if states[2] is not None:
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(states[2])


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """accelerate's single-generator form of :func:`synchronize_rng_states` (a collective)."""
    if rng_type is not None:
        synchronize_rng_states([rng_type], generator=generator)
