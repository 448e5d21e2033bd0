"""ProjectConfiguration's checkpoint naming and limit, save/load pre-hooks, save and save_model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import Accelerator, ProjectConfiguration, debug_launcher
from notebook_accel.errors import CheckpointError, ConfigError


def _prepared(config: ProjectConfiguration | None = None) -> tuple[Accelerator, Any, Any]:
    acc = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _step(acc: Accelerator, model: Any, opt: Any) -> None:
    acc.backward(model(torch.ones(2, 3)).sum())
    opt.step()
    opt.zero_grad()


def test_automatic_naming_keeps_total_limit_and_loads_the_latest(tmp_path: Path) -> None:
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    acc, model, opt = _prepared(config)
    saved = []
    for _ in range(3):
        _step(acc, model, opt)
        path = acc.save_state()
        saved.append(model.weight.detach().clone())
    assert path == (tmp_path / "checkpoints" / "checkpoint_2").absolute()
    assert config.iteration == 3
    # The oldest went; our staging folders are never counted as checkpoints.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "checkpoint_1",
        "checkpoint_2",
    ]

    # A new run with the same configuration resumes from the newest, and numbers on from it.
    again = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    acc2, model2, opt2 = _prepared(again)
    acc2.load_state()
    assert torch.equal(model2.weight, saved[2]) and acc2.step == 3
    assert again.iteration == 3
    acc2.save_state()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "checkpoint_2",
        "checkpoint_3",
    ]
    # The folder for the current iteration exists: refused, as accelerate does.
    again.iteration = 3
    with pytest.raises(ConfigError, match="project_config.iteration"):
        acc2.save_state()


def test_without_a_folder_or_automatic_naming(tmp_path: Path) -> None:
    acc, *_ = _prepared()
    with pytest.raises(ConfigError, match="output_dir=None"):
        acc.save_state()
    with pytest.raises(ConfigError, match="input_dir=None"):
        acc.load_state()
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    with pytest.raises(CheckpointError, match="holds no checkpoint_<n> folder"):
        _prepared(config)[0].load_state()


def test_pre_hooks_can_take_over_a_model(tmp_path: Path) -> None:
    acc, model, opt = _prepared()
    head = acc.prepare(torch.nn.Linear(2, 2))
    calls: list[Any] = []

    def save_hook(models: list[Any], weights: list[Any], output_dir: str) -> None:
        calls.append(("save", len(models), sorted(weights[0]), output_dir))
        torch.save(weights.pop(0), Path(output_dir).parent / "first.pt")  # saved its own way

    def load_hook(models: list[Any], input_dir: str) -> None:
        calls.append(("load", len(models), input_dir))
        first = models.pop(0)
        first.load_state_dict(torch.load(Path(input_dir).parent / "first.pt"))

    handles = [acc.register_save_state_pre_hook(save_hook)]
    handles.append(acc.register_load_state_pre_hook(load_hook))
    _step(acc, model, opt)
    acc.save_state(tmp_path / "ckpt")
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert "model.safetensors" in files and "model_1.safetensors" not in files  # head only
    expected = (model.weight.detach().clone(), head.weight.detach().clone())
    with torch.no_grad():
        model.weight.zero_()
        head.weight.zero_()
    acc.load_state(tmp_path / "ckpt")
    assert torch.equal(model.weight, expected[0]) and torch.equal(head.weight, expected[1])
    folder = str(tmp_path / "ckpt")
    assert calls == [("save", 2, ["bias", "weight"], folder), ("load", 2, folder)]
    for handle in handles:
        handle.remove()
    acc.save_state(tmp_path / "ckpt")
    assert "model_1.safetensors" in {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert len(calls) == 2


def _save_everywhere(folder: str) -> str:
    acc = Accelerator(cpu=True)
    path = Path(folder) / f"from_{acc.process_index}.pt"
    acc.save({"rank": acc.process_index}, path)  # every process calls; the main one writes
    if acc.is_main_process:  # the main process alone may call it too: nothing waits
        acc.save({"w": torch.ones(2)}, Path(folder) / "alone.safetensors", safe_serialization=True)
    acc.wait_for_everyone()
    return acc.process_index


def test_save_writes_on_the_main_process(tmp_path: Path) -> None:
    debug_launcher(_save_everywhere, args=(str(tmp_path),), num_processes=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone.safetensors", "from_0.pt"]
    assert torch.load(tmp_path / "from_0.pt", weights_only=True) == {"rank": 0}
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "alone.safetensors")["w"], torch.ones(2))


def test_save_model_shards_and_bin(tmp_path: Path) -> None:
    acc, model, _ = _prepared()
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    tied[1].weight = tied[0].weight  # tied weights are written once
    index = acc.save_model(tied, tmp_path / "tied", max_shard_size="40")
    assert index.name == "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    assert sorted(weight_map) == ["0.bias", "0.weight", "1.bias"]
    restored = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    restored[1].weight = restored[0].weight
    from safetensors.torch import load_file

    merged: dict[str, torch.Tensor] = {}
    for name in set(weight_map.values()):
        merged.update(load_file(tmp_path / "tied" / name))
    restored.load_state_dict(merged, strict=False)
    assert torch.equal(restored[1].weight, tied[1].weight)
    # A later, unsharded save removes the stale shards and the index.
    path = acc.save_model(tied, tmp_path / "tied")
    assert sorted(p.name for p in (tmp_path / "tied").iterdir()) == ["model.safetensors"]
    bin_path = acc.save_model(model, tmp_path / "bin", safe_serialization=False)
    assert bin_path.name == "pytorch_model.bin" and path.name == "model.safetensors"
    assert set(torch.load(bin_path, weights_only=True)) == {"weight", "bias"}
    with pytest.raises(ConfigError, match="max_shard_size"):
        acc.save_model(model, tmp_path / "bad", max_shard_size="ten")
    with pytest.raises(ConfigError, match="save_directory"):
        acc.save_model(model, bin_path)
