"""fp8 through torchao: refused where the hardware has no float8, the whole path on CPU through
torchao's emulation (asked for explicitly), in real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notebook_accel import notebook_launcher
from notebook_accel.errors import ConfigError

pytest.importorskip("torchao", reason="torchao is not installed (pip install '.[fp8]')")


def test_fp8_without_float8_hardware_is_refused_at_construction() -> None:
    from notebook_accel import Accelerator

    with pytest.raises(ConfigError) as err:
        Accelerator(mixed_precision="fp8", cpu=True)
    assert err.value.parameter == "mixed_precision" and err.value.value == "fp8"
    assert "compute capability >= 8.9" in err.value.accepted
    assert "Float8LinearConfig(emulate=True)" in str(err.value)


def test_launcher_refuses_fp8_on_cpu_before_any_process_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    def train() -> None:
        marker.touch()

    with pytest.raises(ConfigError) as err:
        notebook_launcher(train, num_processes=2, mixed_precision="fp8", hardware="cpu")
    assert err.value.parameter == "mixed_precision"
    assert "8.9" in str(err.value) and "emulate=True" in str(err.value)
    assert not marker.exists()


def _emulated_fp8_run(folder: str) -> dict[str, Any]:
    import torch
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    from notebook_accel import Accelerator, AORecipeKwargs

    def build() -> tuple[Any, Any, Any]:
        acc = Accelerator(
            mixed_precision="fp8",
            kwargs_handlers=[AORecipeKwargs(config=Float8LinearConfig(emulate=True))],
        )
        torch.manual_seed(0)
        dims = [16, 64, 64, 64, 40, 1]  # 64 -> 40: not a multiple of 16, stays nn.Linear
        layers: list[torch.nn.Module] = []
        for a, b in zip(dims, dims[1:], strict=False):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # built before prepare
        return acc, model, opt

    acc, model, opt = build()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1, keepdim=True) - x[:, 4:8].sum(1, keepdim=True)) / 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model, opt, loader = acc.prepare(model, opt, loader)
    inner = acc.unwrap_model(model)
    converted = sorted(n for n, m in inner.named_modules() if isinstance(m, Float8Linear))
    losses = []
    for _ in range(6):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(acc.reduce(loss.detach(), "mean").item())
    acc.save_state(folder)
    saved = {k: v.clone() for k, v in acc.get_state_dict(model).items()}

    acc2, model2, opt2 = build()
    loader2 = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model2, opt2, _ = acc2.prepare(model2, opt2, loader2)
    acc2.load_state(folder)
    loaded = acc2.get_state_dict(model2)
    same = all(torch.equal(saved[k], loaded[k]) for k in saved) and saved.keys() == loaded.keys()
    moments = opt2.state_dict()["state"]
    return {
        "converted": converted,
        "first": sum(losses[:4]) / 4,
        "last": sum(losses[-4:]) / 4,
        "dtype": str(model(x[:2]).dtype),
        "round_trip": same,
        "optimizer_state": len(moments) == len(list(model2.parameters())),
        "mixed_precision": acc.mixed_precision,
    }


def test_emulated_fp8_converts_inner_layers_trains_and_checkpoints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    results = notebook_launcher(
        _emulated_fp8_run, args=(str(tmp_path / "ckpt"),), num_processes=2, hardware="cpu"
    )
    # torchao's warnings about its CUDA libraries, which cannot load on a CPU build, stay out
    # of the cell (two lines per worker otherwise).
    assert "Failed to load" not in "".join(capfd.readouterr())
    for r in results:
        # First and last Linear kept, the 64 -> 40 layer kept (not a multiple of 16).
        assert r["converted"] == ["2", "4"]
        assert r["last"] < 0.5 * r["first"], r
        assert r["dtype"] == "torch.float32"  # outputs come back in float32, as for bf16
        assert r["round_trip"] and r["optimizer_state"]
        assert r["mixed_precision"] == "fp8"
    assert results[0]["first"] == results[1]["first"]  # reduced across ranks


def test_a_custom_module_filter_is_used() -> None:
    import torch
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    from notebook_accel import Accelerator, AORecipeKwargs

    recipe = AORecipeKwargs(
        config=Float8LinearConfig(emulate=True),
        module_filter_func=lambda module, fqn: fqn == "0",
    )
    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe], cpu=True)
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)))
    kinds = [type(m) is Float8Linear for m in acc.unwrap_model(model)]
    assert kinds == [True, False]

    plain = AORecipeKwargs(config=Float8LinearConfig(emulate=True))
    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[plain], cpu=True)
    model = acc.prepare(torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4))))
    acc.prepare(model)  # prepared twice: the Float8Linear layers are not converted again
    names = [type(m).__name__ for m in model]
    assert names == ["Linear", "Float8Linear", "Float8Linear", "Linear"]


def test_fp8_options_without_fp8_are_refused() -> None:
    from notebook_accel import Accelerator, AORecipeKwargs

    with pytest.raises(ConfigError, match="'fp8' when kwargs_handlers holds an AORecipeKwargs"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()], cpu=True)


def _fsdp_fp8() -> tuple[float, float, int]:
    import torch
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    from notebook_accel import Accelerator, AORecipeKwargs

    config = Float8LinearConfig(emulate=True, enable_fsdp_float8_all_gather=True)
    acc = Accelerator(mixed_precision="fp8", fsdp="full", kwargs_handlers=[AORecipeKwargs(config)])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(acc.process_index))
    losses = []
    for _ in range(20):
        loss = model(x).pow(2).mean()
        acc.backward(loss)
        opt.step()  # then the float8 scales of every sharded weight, in one all-reduce
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())
    return losses[0], losses[-1], sum(isinstance(m, Float8Linear) for m in model.modules())


def test_emulated_fp8_with_fsdp_gathers_in_float8_and_trains() -> None:
    results = notebook_launcher(_fsdp_fp8, num_processes=2, hardware="cpu")
    for first, last, converted in results:
        assert converted == 2 and last < 0.1 * first
