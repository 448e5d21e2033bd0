"""init_empty_weights and init_on_device build models without memory; one tensor is set at
a time with set_module_tensor_to_device, as accelerate 1.16 does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from notebook_accel.big_modeling import init_empty_weights, init_on_device
from notebook_accel.errors import ConfigError
from notebook_accel.utils import set_module_tensor_to_device

ROOT = Path(__file__).resolve().parents[2]

# A 4 GiB model (16 Linear layers of 8192 x 8192 floats) built empty in a fresh process:
# the resident set before and after, in bytes.
_BUILD_4_GIB = """
import json, psutil, torch
from torch import nn
from notebook_accel.big_modeling import init_empty_weights
process = psutil.Process()
nn.Linear(8, 8)  # torch's first module: its lazy set-up is not the model's
before = process.memory_info().rss
with init_empty_weights():
    model = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(16)])
after = process.memory_info().rss
size = sum(p.numel() * p.element_size() for p in model.parameters())
meta = all(p.is_meta for p in model.parameters())
print(json.dumps({"before": before, "after": after, "size": size, "meta": meta}))
"""


def test_a_4_gib_model_built_empty_takes_under_50_mib() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_4_GIB],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["size"] >= 4 * 2**30
    assert figures["meta"]
    grown = figures["after"] - figures["before"]
    assert grown < 50 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_a_transformers_model_from_its_config_is_empty_but_its_buffers_are_not() -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32,
    )  # fmt: skip
    with init_empty_weights():
        model = BertModel(config)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {b.device.type for b in model.buffers()} == {"cpu"}
    with init_empty_weights(include_buffers=True):
        model = BertModel(config)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}


def test_the_patch_is_gone_after_the_block_even_after_an_error() -> None:
    with pytest.raises(RuntimeError), init_empty_weights():
        raise RuntimeError("inside")
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_init_on_device_keeps_the_parameter_class_and_requires_grad() -> None:
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3), requires_grad=False)

    with init_on_device(torch.device("meta")):
        module = Frozen()
    assert type(module.weight) is nn.Parameter
    assert module.weight.is_meta and not module.weight.requires_grad


def test_the_environment_variable_includes_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        norm = nn.BatchNorm1d(4)
    assert norm.running_mean.is_meta


def test_set_module_tensor_to_device_fills_a_meta_model_as_accelerate_does() -> None:
    from accelerate.utils import set_module_tensor_to_device as theirs

    results = []
    for setter in (set_module_tensor_to_device, theirs):
        with init_empty_weights():
            model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
        setter(model, "0.weight", "cpu", value=torch.ones(2, 3, dtype=torch.float64))
        setter(model, "0.bias", "cpu", value=torch.zeros(2), dtype=torch.float16)
        setter(model, "1.weight", "meta", dtype=torch.float16)
        setter(model, "1.running_mean", "cpu", value=torch.full((2,), 3.0))
        state = {
            name: (tensor.device.type, tensor.dtype, type(tensor).__name__)
            for name, tensor in model.state_dict(keep_vars=True).items()
        }
        results.append((state, model[0].weight.tolist(), model[1].running_mean.tolist()))
    assert results[0] == results[1]


def test_set_module_tensor_to_device_refuses_what_cannot_be_done() -> None:
    with init_empty_weights():
        layer = nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="value"):
        set_module_tensor_to_device(layer, "weight", "cpu")
    with pytest.raises(ConfigError, match="shape"):
        set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(3, 3))
    with pytest.raises(ConfigError, match="tensor_name"):
        set_module_tensor_to_device(layer, "nothing", "cpu", value=torch.ones(1))


def test_the_module_paths_import_without_torch() -> None:
    code = (
        "import sys\n"
        "from notebook_accel import big_modeling, hooks, utils\n"
        "names = [*big_modeling.__all__, *hooks.__all__]\n"
        "assert 'load_checkpoint_and_dispatch' in dir(big_modeling)\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "False"
