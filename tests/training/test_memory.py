"""Memory helpers: retrying at smaller batch sizes after real out-of-memory errors; releasing."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from notebook_accel import ConfigError, find_executable_batch_size, release_memory
from notebook_accel.training.memory import should_reduce_batch_size


def test_cuda_style_out_of_memory_shrinks_the_batch_by_a_tenth() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size * scale

    assert train(10) == 360
    assert tried == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46, 41, 36]
    assert train(1) == 36 and tried[-1] == 36  # the size found is kept for the next call


def test_a_real_cpu_allocation_failure_shrinks_the_batch() -> None:
    tried: list[int] = []

    def halve() -> int:
        return tried[-1] // 2

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=halve)
    def allocate(batch_size: int) -> int:
        tried.append(batch_size)
        # Beyond any address space (256 TiB a sample) above 16, a few KiB at or below 16.
        per_sample = 2**12 if batch_size <= 16 else 2**48
        return torch.empty(batch_size * per_sample, dtype=torch.uint8).numel()

    assert allocate() == 16 * 2**12
    assert tried == [64, 32, 16]


def test_other_errors_are_raised_and_zero_is_reported() -> None:
    @find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size: int) -> None:
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()

    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="reached zero"):
        never_fits()
    with pytest.raises(TypeError, match="first argument"):
        find_executable_batch_size(lambda batch_size: None)(8)
    with pytest.raises(ConfigError, match="starting_batch_size"):
        find_executable_batch_size(lambda batch_size: None, starting_batch_size=0)


def test_should_reduce_batch_size_recognises_allocator_messages() -> None:
    try:
        torch.empty(2**55, dtype=torch.uint8)
    except RuntimeError as real:
        assert should_reduce_batch_size(real)
    assert should_reduce_batch_size(torch.OutOfMemoryError("anything"))
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))
    assert not should_reduce_batch_size(KeyError(" out of memory."))


def test_release_memory_returns_nones_and_collects_garbage() -> None:
    def orphan_cycle() -> weakref.ref[torch.nn.Module]:
        model = torch.nn.Linear(4, 4)
        model.__dict__["me"] = model  # a cycle: only the garbage collector frees it
        return weakref.ref(model)

    gc.disable()
    try:
        probe = orphan_cycle()
        assert probe() is not None  # unreachable, but not yet collected
        model, other = release_memory(torch.nn.Linear(2, 2), [1])
        assert (model, other) == (None, None)
        assert probe() is None
    finally:
        gc.enable()
