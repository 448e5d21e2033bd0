"""Big models in pieces on a GPU: blocks dispatched to cuda:0, the CPU and the disk (lent
to the GPU per forward), cpu_offload and cpu_offload_with_hook, init_on_device("cuda").

Only torch is needed (safetensors for the disk): the model is a small residual network
built here, compared with the same weights run whole on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from notebook_accel.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    dispatch_model,
    infer_auto_device_map,
    init_on_device,
)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Net(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _pair() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Net().eval()
    reference = Net().eval()
    reference.load_state_dict(model.state_dict())
    return model, reference.to("cuda:0"), torch.randn(4, 16)


def test_blocks_on_the_gpu_and_the_cpu_give_the_whole_models_output() -> None:
    model, reference, x = _pair()
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "cpu"}
    device_map |= {"blocks.3": 0, "head": "cpu"}
    dispatch_model(model, device_map)
    assert model.blocks[0].up.weight.device == torch.device("cuda", 0)
    assert model.blocks[1].up.weight.is_meta  # lent to the GPU per forward
    with torch.no_grad():
        out = model(x)
        expected = reference(x.to("cuda:0"))
    assert out.device.type == "cpu"  # back where the input came from
    torch.testing.assert_close(out, expected.cpu())


def test_blocks_on_the_gpu_the_cpu_and_the_disk(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    model, reference, x = _pair()
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "disk"}
    device_map |= {"blocks.3": "disk", "head": 0}
    dispatch_model(model, device_map, offload_dir=tmp_path)
    assert (tmp_path / "index.json").is_file()
    with torch.no_grad():
        torch.testing.assert_close(model(x.to("cuda:0")), reference(x.to("cuda:0")))


def test_an_automatic_map_puts_a_small_model_on_gpu_0() -> None:
    model, _, _ = _pair()
    assert infer_auto_device_map(model) == {"": 0}
    budget = {0: 200_000, "cpu": 10**9}
    assert set(infer_auto_device_map(model, budget, ["Block"]).values()) == {0, "cpu"}


def test_cpu_offload_lends_every_weight_to_the_gpu() -> None:
    model, reference, x = _pair()
    cpu_offload(model, execution_device="cuda:0")
    assert model.head.weight.is_meta
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x.to("cuda:0")).cpu())


def test_cpu_offload_with_hook_moves_the_model_for_its_call_and_back() -> None:
    model, reference, x = _pair()
    model, hook = cpu_offload_with_hook(model, execution_device="cuda:0")
    assert model.head.weight.device.type == "cpu"
    with torch.no_grad():
        out = model(x)
    assert model.head.weight.device == torch.device("cuda", 0)
    torch.testing.assert_close(out, reference(x.to("cuda:0")))
    hook.offload()
    assert model.head.weight.device.type == "cpu"


def test_init_on_device_builds_on_the_gpu() -> None:
    with init_on_device("cuda:0"):
        layer = nn.Linear(4, 4)
    assert layer.weight.device == torch.device("cuda", 0)
    assert layer.weight.requires_grad
