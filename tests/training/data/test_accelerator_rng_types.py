"""Accelerator(rng_types=...): generators made equal across ranks at each loader iteration."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, debug_launcher
from notebook_accel.errors import ConfigError


def _draws(rng_types: list[str] | None) -> list[float]:
    from notebook_accel.seeding import set_seed

    acc = Accelerator(cpu=True, rng_types=rng_types)
    set_seed(0, device_specific=True)  # each rank its own stream
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2))
    draws: list[float] = []
    for _ in range(2):  # each epoch starts from rank 0's state
        for _batch in loader:
            draws.append(torch.rand(1).item())
    return draws


def _each_choice() -> dict[str, list[float]]:
    return {str(choice): _draws(choice) for choice in (None, ["generator"], ["torch"])}


def test_torch_generator_synchronised_per_iteration() -> None:
    first, second = debug_launcher(_each_choice, num_processes=2)
    assert first["None"] != second["None"]  # accelerate's default: only the shuffle agrees
    assert first["['generator']"] != second["['generator']"]
    assert first["['torch']"] == second["['torch']"]
    assert len(set(first["['torch']"])) == len(first["['torch']"]) == 4  # the stream goes on


def test_rng_types_bad_input() -> None:
    with pytest.raises(ConfigError, match="rng_types"):
        Accelerator(cpu=True, rng_types=["numpy"])
    assert Accelerator(cpu=True).rng_types == ["generator"]
