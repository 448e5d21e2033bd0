"""merge_fsdp_weights: a sharded save_state's model as one whole weights file (real FSDP on
2 gloo processes), read through the guarded DCP reader."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import debug_launcher
from notebook_accel.errors import CheckpointError


def _train_and_save(folder: str) -> dict[str, Any]:
    import torch.nn.functional as F

    from notebook_accel import Accelerator
    from notebook_accel.utils import merge_fsdp_weights

    acc = Accelerator(fsdp="full")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(acc.process_index))
    acc.backward(F.mse_loss(model(x), torch.zeros(4, 3)))
    opt.step()
    acc.save_state(str(Path(folder) / "ckpt"))
    whole = acc.get_state_dict(model)  # the main process's whole dict
    # every rank calls it, as a script's end would: rank 0 writes, the others wait
    written = merge_fsdp_weights(Path(folder) / "ckpt", Path(folder) / "in_job")
    return {"whole": {k: v.clone() for k, v in whole.items()}, "written": written}


def test_a_sharded_checkpoint_merges_into_the_whole_model(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from notebook_accel.utils import merge_fsdp_weights

    results = debug_launcher(_train_and_save, args=(str(tmp_path),), num_processes=2)
    whole = results[0]["whole"]
    assert results[0]["written"] == tmp_path / "in_job" / "model.safetensors"
    assert results[1]["written"] is None
    assert sorted(whole) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for merged in (
        load_file(tmp_path / "in_job" / "model.safetensors"),
        load_file(merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "out")),
        load_file(merge_fsdp_weights(tmp_path / "ckpt" / "sharded", tmp_path / "out2")),
    ):
        assert sorted(merged) == sorted(whole)
        for key, value in whole.items():
            assert torch.equal(merged[key], value), key
    bin_file = merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "bin", safe_serialization=False)
    assert bin_file is not None and bin_file.name == "pytorch_model.bin"
    assert torch.equal(torch.load(bin_file, weights_only=True)["2.bias"], whole["2.bias"])
    merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "last", remove_checkpoint_dir=True)
    assert not (tmp_path / "ckpt").exists()


def test_a_folder_without_shards_is_a_checkpoint_error(tmp_path: Path) -> None:
    from notebook_accel.utils import merge_fsdp_weights

    with pytest.raises(CheckpointError, match="no DCP checkpoint"):
        merge_fsdp_weights(tmp_path, tmp_path / "out")


def test_accelerates_layout_merges_too(tmp_path: Path) -> None:
    """accelerate's save_fsdp_model writes {"model": state dict} with DCP into
    pytorch_model_fsdp_0 (written here by DCP in one process, as its files are)."""
    pytest.importorskip("safetensors")
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from notebook_accel.utils import merge_fsdp_weights

    model = torch.nn.Linear(3, 2)
    folder = tmp_path / "pytorch_model_fsdp_0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process
        dcp.save({"model": model.state_dict()}, checkpoint_id=folder, no_dist=True)
    merged = load_file(merge_fsdp_weights(folder, tmp_path / "out"))
    assert sorted(merged) == ["bias", "weight"]
    assert torch.equal(merged["weight"], model.weight.detach())
