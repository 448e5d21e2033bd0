"""A launch's ranks each dispatch a model (CPU and disk, an offload folder per rank) and
return the plain model's logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from notebook_accel import notebook_launcher

from .models import logits, saved

TOKENS = torch.tensor([[1, 5, 9, 3, 7, 2, 8, 4]])


def _dispatched(folder: Path, config: Any) -> dict[str, Any]:
    from notebook_accel import PartialState
    from notebook_accel.big_modeling import load_checkpoint_and_dispatch
    from notebook_accel.utils import compute_module_sizes
    from tests.big_model.models import empty

    rank = PartialState().process_index
    model = empty("gpt2", config)
    model = load_checkpoint_and_dispatch(
        model,
        folder / "ckpt",
        device_map="auto",
        max_memory={"cpu": compute_module_sizes(model)[""] // 2},
        no_split_module_classes=["GPT2Block"],
        offload_folder=folder / f"offload-{rank}",
    )
    return {
        "rank": rank,
        "logits": logits(model, TOKENS),
        "places": sorted(set(map(str, model.hf_device_map.values()))),
    }


def test_each_rank_dispatches_its_own_model(tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    config, folder = saved("gpt2", tmp_path / "ckpt")
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    expected = logits(model, TOKENS)
    results = notebook_launcher(
        _dispatched, args=(tmp_path, config), num_processes=2, hardware="cpu"
    )
    assert [r["rank"] for r in results] == [0, 1]
    for result in results:
        assert result["places"] == ["cpu", "disk"]
        torch.testing.assert_close(result["logits"], expected, rtol=0, atol=0)
    assert (tmp_path / "offload-0" / "index.json").is_file()
    assert (tmp_path / "offload-1" / "index.json").is_file()
