"""The fsdp launch option: validated in the parent, carried to the workers' Accelerator."""

from __future__ import annotations

import pytest

from notebook_accel import ConfigError, FsdpConfig, notebook_launcher
from notebook_accel.config import LaunchConfig, load_file, save_file


def _shard_sizes() -> tuple[int, int, str]:
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    total = sum(p.numel() for p in model.parameters())
    model = acc.prepare(model)
    local = sum(p.to_local().numel() for p in model.parameters())  # DTensors: sharded
    return total, local, type(model).__name__


def test_launch_option_shards_the_model_in_every_worker() -> None:
    results = notebook_launcher(_shard_sizes, num_processes=2, hardware="cpu", fsdp="full")
    total = results[0][0]
    assert sum(local for _, local, _ in results) == total
    assert all(local < total for _, local, _ in results)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"fsdp": "zero3", "num_processes": 2}, "fsdp.sharding_strategy"),
        ({"fsdp": {"colour": 1}, "num_processes": 2}, "fsdp['colour']"),
        ({"fsdp": "full", "num_processes": 1}, "fsdp"),
    ],
)
def test_bad_fsdp_is_refused_before_any_process(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        notebook_launcher(_shard_sizes, hardware="cpu", **kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_config_file_keeps_the_fsdp_choice() -> None:
    save_file(LaunchConfig(fsdp={"sharding_strategy": "grad_op", "min_num_params": 10}))
    assert load_file()["fsdp"]["sharding_strategy"] == "grad_op"
    config = LaunchConfig.from_defaults()
    assert config.fsdp == FsdpConfig(sharding_strategy="grad_op", min_num_params=10)


def test_panel_offers_sharding() -> None:
    from notebook_accel import LaunchPanel

    panel = LaunchPanel(_shard_sizes)
    panel.sharding.value = "full"
    assert panel.launch_config.fsdp == FsdpConfig(sharding_strategy="full")
    panel.sharding.value = "no"
    assert panel.launch_config.fsdp is None
