"""Checkpoints loaded in pieces and dispatched to the CPU and the disk give the plain model's
logits; the offload helpers and hooks come and go as accelerate's do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from notebook_accel.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from notebook_accel.errors import ConfigError
from notebook_accel.hooks import AlignDevicesHook, remove_hook_from_module
from notebook_accel.utils import compute_module_sizes, load_checkpoint_in_model

from .models import BLOCKS, build, empty, logits, saved

TOKENS = torch.tensor([[1, 5, 9, 3, 7, 2, 8, 4], [6, 2, 2, 9, 1, 0, 3, 5]])


def plain(kind: str, folder: Path) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    config, _ = saved(kind, folder)
    model = build(kind, config)
    model.load_state_dict(build_loaded(kind, config, folder).state_dict())
    return model, empty(kind, config), logits(model, TOKENS)


def build_loaded(kind: str, config: object, folder: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForCausalLM if kind == "gpt2" else AutoModelForMaskedLM
    return auto.from_pretrained(folder).eval()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_sharded_checkpoint_on_cpu_and_disk_gives_the_same_logits(
    kind: str, tmp_path: Path
) -> None:
    model, meta, expected = plain(kind, tmp_path / "ckpt")
    assert len(list((tmp_path / "ckpt").glob("*.safetensors"))) > 2
    budget = compute_module_sizes(meta)[""] // 2
    dispatched = load_checkpoint_and_dispatch(
        meta,
        tmp_path / "ckpt",
        device_map="auto",
        max_memory={"cpu": budget},
        no_split_module_classes=[BLOCKS[kind]],
        offload_folder=tmp_path / "offload",
    )
    assert set(dispatched.hf_device_map.values()) == {"cpu", "disk"}
    torch.testing.assert_close(logits(dispatched, TOKENS), expected, rtol=0, atol=0)
    torch.testing.assert_close(logits(dispatched, TOKENS), expected, rtol=0, atol=0)
    assert not list((tmp_path / "offload").glob("*.bin"))


@pytest.mark.parametrize("device_map", ["sequential", "balanced"])
def test_every_named_map_and_a_single_file_load(device_map: str, tmp_path: Path) -> None:
    config, _ = saved("gpt2", tmp_path / "ckpt", shard="10GB")
    reference = build_loaded("gpt2", config, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    meta = empty("gpt2", config)
    dispatched = load_checkpoint_and_dispatch(
        meta,
        tmp_path / "ckpt" / "model.safetensors",
        device_map=device_map,
        max_memory={"cpu": compute_module_sizes(meta)[""] // 3},
        offload_folder=tmp_path / "offload",
    )
    assert "disk" in dispatched.hf_device_map.values()
    torch.testing.assert_close(logits(dispatched, TOKENS), logits(reference, TOKENS))


def test_a_dict_map_with_a_tied_head_on_disk(tmp_path: Path) -> None:
    model, meta, expected = plain("gpt2", tmp_path / "ckpt")
    device_map = {"transformer": "cpu", "lm_head": "disk"}
    load_checkpoint_in_model(meta, tmp_path / "ckpt", device_map, tmp_path / "offload")
    assert meta.lm_head.weight.is_meta
    dispatched = dispatch_model(meta, device_map, offload_dir=tmp_path / "offload")
    torch.testing.assert_close(logits(dispatched, TOKENS), expected, rtol=0, atol=0)
    device_map = {"transformer.wte": "disk", "transformer.h": "disk", "": "cpu"}
    other = empty("gpt2", model.config)
    dispatched = load_checkpoint_and_dispatch(
        other, tmp_path / "ckpt", device_map, offload_folder=tmp_path / "offload2"
    )
    torch.testing.assert_close(logits(dispatched, TOKENS), expected, rtol=0, atol=0)


def test_dtype_casts_floating_weights_only(tmp_path: Path) -> None:
    _, meta, _ = plain("bert", tmp_path / "ckpt")
    load_checkpoint_in_model(meta, tmp_path / "ckpt", {"": "cpu"}, dtype="float16")
    assert {p.dtype for p in meta.parameters()} == {torch.float16}
    assert meta.bert.embeddings.token_type_ids.dtype == torch.int64


def test_helpers_offload_and_the_hooks_come_off(tmp_path: Path) -> None:
    model, _, expected = plain("bert", tmp_path / "ckpt")
    cpu_offload(model, execution_device="cpu")
    assert isinstance(model.bert.embeddings.word_embeddings._hf_hook, AlignDevicesHook)
    assert model.bert.embeddings.word_embeddings.weight.is_meta
    torch.testing.assert_close(logits(model, TOKENS), expected, rtol=0, atol=0)
    remove_hook_from_module(model, recurse=True)
    assert not model.bert.embeddings.word_embeddings.weight.is_meta
    assert not hasattr(model.bert.embeddings.word_embeddings, "_hf_hook")
    torch.testing.assert_close(logits(model, TOKENS), expected, rtol=0, atol=0)
    disk_offload(model, tmp_path / "disk", execution_device="cpu")
    assert (tmp_path / "disk" / "index.json").is_file()
    torch.testing.assert_close(logits(model, TOKENS), expected, rtol=0, atol=0)


def test_cpu_offload_with_hook_runs_then_offloads(tmp_path: Path) -> None:
    model, _, expected = plain("gpt2", tmp_path / "ckpt")
    model, hook = cpu_offload_with_hook(model, execution_device="cpu")
    torch.testing.assert_close(logits(model, TOKENS), expected, rtol=0, atol=0)
    hook.offload()
    assert next(model.parameters()).device.type == "cpu"
    hook.remove()
    assert "_hf_hook" not in model.__dict__


def test_bad_maps_are_refused(tmp_path: Path) -> None:
    _, meta, _ = plain("gpt2", tmp_path / "ckpt")
    with pytest.raises(ConfigError, match="device_map"):
        load_checkpoint_and_dispatch(meta, tmp_path / "ckpt", device_map="everywhere")
    with pytest.raises(ConfigError, match="device_map"):
        dispatch_model(meta, {"lm_head": "cpu"})
    with pytest.raises(ConfigError, match="offload_dir"):
        dispatch_model(meta, {"transformer": "disk", "lm_head": "cpu"})
    with pytest.raises(ConfigError, match="checkpoint"):
        load_checkpoint_in_model(meta, tmp_path / "nothing")


def test_a_torch_file_loads_with_weights_only_and_a_pickle_is_refused(tmp_path: Path) -> None:
    import pickle

    model, meta, expected = plain("gpt2", tmp_path / "ckpt")
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    load_checkpoint_in_model(meta, tmp_path / "pytorch_model.bin")  # no map: on the CPU
    assert not any(p.is_meta for p in meta.parameters())
    torch.testing.assert_close(logits(meta, TOKENS), expected, rtol=0, atol=0)

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("code ran",))

    (tmp_path / "evil").mkdir()
    torch.save({"transformer.wte.weight": Payload()}, tmp_path / "evil" / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint_in_model(meta, tmp_path / "evil")


class ReadsItsChild(nn.Module):
    """A forward that reads a child's weight without calling the child."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.inner.weight.T + self.inner.bias


def test_preload_module_classes_lend_a_whole_subtree(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(ReadsItsChild(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    expected = model(x)
    device_map = {"0": "disk", "1": "cpu"}
    dispatch_model(model, device_map, offload_dir=tmp_path / "a")
    with pytest.raises(RuntimeError):  # each module lends its own: the child's is not lent
        model(x)
    remove_hook_from_module(model, recurse=True)
    torch.manual_seed(0)
    model = nn.Sequential(ReadsItsChild(), nn.Linear(4, 2))
    dispatch_model(
        model, device_map, offload_dir=tmp_path / "b", preload_module_classes=["ReadsItsChild"]
    )
    assert model[0].inner.weight.is_meta
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model[0].inner.weight.is_meta


def test_a_big_shard_goes_to_disk_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notebook_accel.big_model import loading

    config, _ = saved("gpt2", tmp_path / "ckpt", shard="10GB")  # one file
    reference = build_loaded("gpt2", config, tmp_path / "ckpt")
    monkeypatch.setattr(loading, "DISK_BATCH", 20_000)
    dispatched = load_checkpoint_and_dispatch(
        empty("gpt2", config),
        tmp_path / "ckpt",
        {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h": "disk", "": "cpu"},
        offload_folder=tmp_path / "offload",
    )
    assert len(list((tmp_path / "offload").glob("weights-*.safetensors"))) > 3
    torch.testing.assert_close(logits(dispatched, TOKENS), logits(reference, TOKENS))
