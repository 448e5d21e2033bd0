"""torch.compile through prepare (dynamo_backend / TorchDynamoPlugin): real inductor builds.

The compiled tests build C++ kernels with the machine's compiler: tiny models, one inductor
cache folder for the module (the test process and its workers share the compiled graphs),
one compile thread (no compile-worker pool on a 2-core machine).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import (
    Accelerator,
    ConfigError,
    DynamoBackend,
    TorchDynamoPlugin,
    debug_launcher,
    notebook_launcher,
)
from notebook_accel.training.compile import compile_regions, uncompiled
from notebook_accel.utils import is_compiled_module


class Block(torch.nn.Module):
    """A small residual block (a transformer layer's MLP half)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, width)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module", autouse=True)
def _inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        patch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
        yield


# ---- settings ------------------------------------------------------------------------------
def test_backend_and_plugin_take_accelerates_values() -> None:
    acc = Accelerator(dynamo_backend="inductor")
    assert acc.dynamo_plugin.backend is DynamoBackend.INDUCTOR
    assert acc.state.dynamo_plugin is acc.dynamo_plugin
    plugin = TorchDynamoPlugin(backend="AOT_EAGER", mode="max-autotune", fullgraph=True)
    assert plugin.to_kwargs() == {"backend": "aot_eager", "mode": "max-autotune", "fullgraph": True}
    assert TorchDynamoPlugin().backend is DynamoBackend.NO
    assert not Accelerator().dynamo_plugin.enabled


def test_accelerates_environment_variables_fill_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.INDUCTOR and plugin.mode == "reduce-overhead"
    assert plugin.fullgraph and plugin.use_regional_compilation and plugin.dynamic is None
    assert TorchDynamoPlugin(backend="eager", fullgraph=False).to_kwargs() == {
        "backend": "eager",
        "mode": "reduce-overhead",
    }


@pytest.mark.parametrize(
    ("make", "named", "accepted"),
    [
        (lambda: Accelerator(dynamo_backend="inductr"), "dynamo_backend", "'inductor'"),
        (lambda: TorchDynamoPlugin(backend="fast"), "backend", "'aot_eager'"),
        (lambda: TorchDynamoPlugin(mode="fastest"), "mode", "'max-autotune'"),
        (lambda: TorchDynamoPlugin(fullgraph="yes"), "fullgraph", "True or False"),
        (lambda: TorchDynamoPlugin(mode="max-autotune", options={"a": 1}), "options", "None"),
        (
            lambda: Accelerator(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin()),
            "dynamo_backend",
            "None when dynamo_plugin",
        ),
        (lambda: Accelerator(dynamo_plugin="inductor"), "dynamo_plugin", "TorchDynamoPlugin"),
        (lambda: Accelerator(dynamo_backend="inductor", fsdp="full"), "dynamo_backend", "FSDP"),
    ],
)
def test_bad_values_name_the_parameter(make: Any, named: str, accepted: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.parameter == named and accepted in caught.value.accepted


def test_regional_compilation_compiles_each_block_and_leaves_the_model_alone() -> None:
    net = Net()
    compiled = compile_regions(net, backend="inductor")
    assert all(type(b).__name__ == "OptimizedModule" for b in compiled.layers)
    assert type(compiled.embed).__name__ == type(compiled.head).__name__ == "OptimizedModule"
    assert type(compiled) is Net and compiled is not net and uncompiled(compiled) is net
    assert is_compiled_module(compiled.layers[0]) and not is_compiled_module(compiled)
    assert all(type(b) is Block for b in net.layers)  # the user's module is not changed
    assert [p.data_ptr() for p in compiled.parameters()] == [p.data_ptr() for p in net.parameters()]


def _backend_seen() -> str:
    return str(Accelerator().dynamo_plugin.backend.value)


def test_the_launchers_dynamo_backend_is_the_workers_default() -> None:
    assert notebook_launcher(_backend_seen, num_processes=2, dynamo_backend="Inductor") == [
        "INDUCTOR",
        "INDUCTOR",
    ]


@pytest.mark.parametrize("regional", [False, True], ids=["whole", "regional"])
def test_checkpoints_of_a_compiled_model_keep_the_modules_names(
    regional: bool, tmp_path: Any
) -> None:
    from safetensors.torch import load_file

    acc = Accelerator(
        dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=regional)
    )
    torch.manual_seed(0)
    net = Net()
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    acc.backward(model(torch.randn(2, 4)).sum())
    opt.step()
    saved = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.save_state(tmp_path / "ckpt")
    assert load_file(tmp_path / "ckpt" / "model.safetensors").keys() == Net().state_dict().keys()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(tmp_path / "ckpt")
    for name, value in acc.get_state_dict(model).items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0)
    assert acc.prepare(model) is model  # a prepared, compiled model is not prepared again


# ---- training: compiled equals eager -------------------------------------------------------
def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def _train(plugin: TorchDynamoPlugin, accumulation: int = 1) -> dict[str, Any]:
    acc = Accelerator(dynamo_plugin=plugin, gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(_data(), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses, syncs = [], []
    for _ in range(2):
        for x, y in loader:
            with acc.accumulate(model):
                syncs.append(getattr(model, "require_backward_grad_sync", None))
                loss = F.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
    inner = acc.unwrap_model(model, keep_torch_compile=False)
    return {
        "losses": losses,
        "syncs": syncs,
        "weights": {k: v.clone() for k, v in acc.get_state_dict(model).items()},
        "kind": type(model).__name__,
        "inner": type(inner).__name__,
        "block": type(acc.unwrap_model(model).layers[0]).__name__,
    }


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4, abs=1e-6)
    assert a["weights"].keys() == b["weights"].keys()
    for name, value in a["weights"].items():
        torch.testing.assert_close(value, b["weights"][name], rtol=1e-4, atol=1e-5)


def _runs(accumulation: int) -> list[dict[str, Any]]:
    return [
        _train(TorchDynamoPlugin(backend=backend, use_regional_compilation=regional), accumulation)
        for backend, regional in (("no", False), ("inductor", False), ("inductor", True))
    ]


@pytest.mark.slow
def test_one_process_compiled_and_regional_train_as_eager() -> None:
    eager, whole, regional = _runs(accumulation=1)
    assert (eager["kind"], whole["kind"], regional["kind"]) == ("Net", "OptimizedModule", "Net")
    assert regional["block"] == "OptimizedModule" and whole["inner"] == "Net"
    _close(whole, eager)
    _close(regional, eager)


@pytest.mark.slow
def test_two_processes_ddp_compiled_and_regional_train_as_eager() -> None:
    ranks = debug_launcher(_runs, args=(2,), num_processes=2)
    for eager, whole, regional in ranks:
        assert eager["kind"] == "DistributedDataParallel"
        assert whole["kind"] == "OptimizedModule" and whole["inner"] == "Net"
        assert (
            regional["kind"] == "DistributedDataParallel" and regional["block"] == "OptimizedModule"
        )
        _close(whole, eager)
        _close(regional, eager)
        # accumulate() reached the DDP wrapper inside: no all-reduce on the first micro-batch
        assert whole["syncs"] == regional["syncs"] == eager["syncs"] == [False, True] * 4
    for a, b in zip(ranks[0], ranks[1], strict=True):  # DDP kept the replicas equal
        for name, value in a["weights"].items():
            torch.testing.assert_close(value, b["weights"][name], rtol=0, atol=0)
