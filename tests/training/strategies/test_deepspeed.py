"""DeepSpeed's ZeRO through the Accelerator on 2 real gloo processes: stages 1-3 equal DDP
(same torch optimizer) with and without accumulation, save/load resumes exactly, save_model
writes a whole state dict, one process works, and bad input is refused before any process.

DeepSpeed is an optional extra: the module is skipped where it is not installed. Launches are
few and each checks several stages (a DeepSpeed launch costs seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher
from notebook_accel.errors import ConfigError
from notebook_accel.options.deepspeed import DeepSpeedPlugin
from tests.tiny_models import tiny_llama_config

pytest.importorskip("deepspeed")


def OPT(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))


def make_loader(shuffle: bool = True) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=shuffle)


def train(
    stage: int | None,
    accumulation: int,
    steps: int = 10,
    folder: str | None = None,
    zero_init: bool = False,
) -> list[torch.Tensor]:
    """``steps`` optimizer steps; ``stage=None`` is DDP. With ``folder``: save halfway,
    train on, load, train the second half again: both second halves must match.
    ``zero_init``: the model is built partitioned (ZeRO-3's init context)."""
    from notebook_accel.training.accelerator import Accelerator

    plugin = None if stage is None else DeepSpeedPlugin(zero_stage=stage)
    acc = Accelerator(gradient_accumulation_steps=accumulation, deepspeed_plugin=plugin)
    if zero_init:
        with acc.state.deepspeed_plugin.zero3_init_context_manager(enable=True):
            model = make_model()
        assert all(p.numel() == 0 for p in model.parameters())  # partitioned as built
    else:
        model = make_model()
    opt = OPT(model.parameters())
    model, opt, loader = acc.prepare(model, opt, make_loader(shuffle=folder is None))
    torch.manual_seed(0)  # the shuffle's draws, whatever DeepSpeed's setup consumed

    # A fixed list of batches: the replay after load_state sees the same ones.
    batches = list(loader)

    def run(n: int, start: int = 0) -> list[float]:
        losses = []
        for i in range(n * accumulation):
            x, y = batches[start + i]
            with acc.accumulate(model):
                loss = F.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    if folder is None:
        run(steps)
        return [t.float() for t in acc.get_state_dict(model).values()]
    half = steps // 2
    run(half)
    acc.save_state(folder)
    first = run(half, half * accumulation)
    acc.load_state(folder)
    second = run(half, half * accumulation)
    assert first == second, (first, second)
    return [t.float() for t in acc.get_state_dict(model).values()]


def _stages(accumulation: int) -> dict[str, list[torch.Tensor]]:
    results = {str(s): train(s, accumulation) for s in (None, 1, 2, 3)}
    results["3 built partitioned"] = train(3, accumulation, zero_init=True)
    return results


@pytest.mark.parametrize("accumulation", [1, 2])
def test_zero_stages_equal_ddp(accumulation: int) -> None:
    results = debug_launcher(_stages, (accumulation,), num_processes=2)
    ddp = results[0]["None"]
    for stage in ("1", "2", "3", "3 built partitioned"):
        for ours, ref in zip(results[0][stage], ddp, strict=True):
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def _resume_and_export(folder: str) -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    out: dict[str, Any] = {}
    train(3, 2, steps=4, folder=f"{folder}/ckpt3i", zero_init=True)  # asserts the replay
    for stage in (2, 3):
        train(stage, 2, steps=4, folder=f"{folder}/ckpt{stage}")  # asserts the replay
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
        model = make_model()
        model, opt = acc.prepare(model, OPT(model.parameters()))
        path = acc.save_model(model, f"{folder}/export{stage}")
        acc.wait_for_everyone()
        out[str(stage)] = (str(path), type(acc.unwrap_model(model)).__name__)
    return out


def test_resume_is_exact_and_save_model_is_a_plain_state_dict(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    results = debug_launcher(_resume_and_export, (str(tmp_path),), num_processes=2)
    assert (tmp_path / "ckpt3i" / "pytorch_model").is_dir()
    for stage in ("2", "3"):
        ckpt = tmp_path / f"ckpt{stage}"
        assert (ckpt / "pytorch_model").is_dir() and (ckpt / "notebook_accel.json").is_file()
        assert not list(tmp_path.glob(f".ckpt{stage}.*"))  # staged, then renamed into place
        path, inner = results[0][stage]
        assert inner == "Sequential"
        plain = make_model()
        plain.load_state_dict(load_file(path))  # every key, whole shapes
        torch.testing.assert_close(plain.state_dict(), make_model().state_dict())


def _one_process() -> tuple[bool, bool, bool, list[float]]:
    from notebook_accel.training.accelerator import Accelerator

    dist = torch.distributed
    before = dist.is_initialized()
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = make_model()
    model, opt = acc.prepare(model, OPT(model.parameters()))
    acc.backward(F.mse_loss(model(torch.ones(4, 6)), torch.zeros(4, 3)))
    during = dist.is_initialized()  # DeepSpeed's group of one
    acc.end_training()
    after = dist.is_initialized()
    # A second Accelerator in the same process starts from nothing and trains.
    return before, during, after, [float(t.sum()) for t in train(2, 2, steps=3)]


def _zero3_init() -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    plugin = acc.state.deepspeed_plugin
    with plugin.zero3_init_context_manager(enable=True):
        inside = plugin.is_zero3_init_enabled()
        model = torch.nn.Linear(64, 32)
    with plugin.zero3_init_context_manager(enable=False):
        whole = torch.nn.Linear(64, 32)
    return {
        "flag": (plugin.zero3_init_flag, inside),
        "partitioned": [(p.ds_numel, p.ds_tensor.numel(), p.numel()) for p in model.parameters()],
        "whole": [(hasattr(p, "ds_numel"), p.numel()) for p in whole.parameters()],
    }


def test_zero3_init_context_builds_the_model_partitioned() -> None:
    for rank in debug_launcher(_zero3_init, num_processes=2):
        assert rank["flag"] == (True, True)  # on at stage 3 by default, as in accelerate
        # Each rank stores half of each parameter; the full tensor is never kept.
        assert rank["partitioned"] == [(2048, 1024, 0), (32, 16, 0)]
        assert rank["whole"] == [(False, 2048), (False, 32)]


def _from_pretrained(path: str) -> dict[str, Any]:
    from transformers import LlamaForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    model = LlamaForCausalLM.from_pretrained(path)  # zero3_init_flag: on at stage 3
    partitioned = all(hasattr(p, "ds_numel") and p.numel() == 0 for p in model.parameters())
    with acc.state.deepspeed_plugin.zero3_init_context_manager(enable=False):
        whole = LlamaForCausalLM.from_pretrained(path)
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state = acc.get_state_dict(model)  # gathered: the weights were loaded into partitions
    acc.end_training()
    return {
        "partitioned": partitioned,
        "whole": not any(hasattr(p, "ds_id") for p in whole.parameters()),
        "state": state,
        "after_end": is_deepspeed_zero3_enabled(),
    }


def test_transformers_builds_partitioned_while_the_flag_is_on(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    saved = transformers.LlamaForCausalLM(tiny_llama_config())
    saved.save_pretrained(tmp_path)
    results = debug_launcher(_from_pretrained, (str(tmp_path),), num_processes=2)
    for rank in results:
        assert rank["partitioned"] and rank["whole"] and not rank["after_end"]
    torch.testing.assert_close(results[0]["state"], saved.state_dict())


def test_zero3_init_flag_follows_accelerate() -> None:
    assert DeepSpeedPlugin(zero_stage=3).zero3_init_flag is True
    assert DeepSpeedPlugin(zero_stage=2).zero3_init_flag is False
    with pytest.warns(UserWarning, match="stage 3 only"):
        assert DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).zero3_init_flag is False
    with pytest.raises(ConfigError, match="Accelerator"):
        with DeepSpeedPlugin(zero_stage=3).zero3_init_context_manager(enable=True):
            pass


def test_zero3_sizes_follow_the_model() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3)
    args = {"accumulation_steps": 1, "mixed_precision": "no", "micro_batch_size": 4}
    zero = plugin.ds_config(**args, world_size=2, hidden_size=512)["zero_optimization"]
    assert zero["reduce_bucket_size"] == 512 * 512  # accelerate's rules from hidden_size
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 512 * 512)
    assert zero["stage3_param_persistence_threshold"] == 5120
    assert zero["sub_group_size"] == zero["stage3_max_reuse_distance"] == 512 * 512
    # On GPUs DeepSpeed's own defaults stay for ours (its tuning is for them).
    gpu = plugin.ds_config(**args, world_size=2, hidden_size=512, device_type="cuda")
    assert gpu["zero_optimization"]["reduce_bucket_size"] == 512 * 512
    assert gpu["zero_optimization"]["sub_group_size"] == 1_000_000_000
    # A config of the user's keeps DeepSpeed's defaults for what it does not say.
    own = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}})
    assert "sub_group_size" not in own.ds_config(**args, world_size=2)["zero_optimization"]


def test_deepspeed_on_one_process_and_end_training_leaves_no_group() -> None:
    ((before, during, after, sums),) = debug_launcher(_one_process, num_processes=1)
    assert (before, during, after) == (False, True, False)
    assert len(sums) == 4


def _fp16_inside() -> None:
    from notebook_accel.training.accelerator import Accelerator

    Accelerator(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))


def test_fp16_with_deepspeed_on_cpu_is_refused_naming_mixed_precision(tmp_path: Path) -> None:
    from notebook_accel import notebook_launcher

    ran = tmp_path / "ran"

    def never() -> None:
        ran.touch()

    # From the launcher's options: in the notebook, before any process starts.
    with pytest.raises(ConfigError, match=r"mixed_precision.*'no' or 'bf16' with DeepSpeed"):
        notebook_launcher(
            never, num_processes=2, hardware="cpu", mixed_precision="fp16", deepspeed=2
        )
    assert not ran.exists()
    # From inside the function: at Accelerator(...), re-raised in the cell.
    with pytest.raises(ConfigError, match=r"mixed_precision='fp16'.*with DeepSpeed on CPU"):
        debug_launcher(_fp16_inside, num_processes=1)


def test_fp16_under_an_engine_has_no_grad_scaler_of_ours() -> None:
    from notebook_accel.training.precision import make_precision

    # DeepSpeed's fp16 config scales the loss; a GradScaler of ours would sit unused.
    engine = make_precision("fp16", "cuda", loss_scaler=False)
    assert engine.scaler is None and engine.dtype == torch.float16


def test_bad_plugin_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="zero_stage"):
        DeepSpeedPlugin(zero_stage=4)
    with pytest.raises(ConfigError, match="offload_optimizer_device"):
        DeepSpeedPlugin(offload_optimizer_device="gpu")
    # an optimizer section is DeepSpeed's to build (DummyOptim): its "auto"s filled from it
    sections = {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": 1e-6}}}
    filled = DeepSpeedPlugin(hf_ds_config=sections).ds_config(
        accumulation_steps=1,
        mixed_precision="no",
        micro_batch_size=4,
        world_size=1,
        fill={"optimizer.params.lr": 0.5, "optimizer.params.eps": 1.0, "scheduler.x": 1},
    )
    assert filled["optimizer"] == {"type": "AdamW", "params": {"lr": 0.5, "eps": 1e-6}}
    assert "scheduler" not in filled
    with pytest.raises(ConfigError, match="lr"):  # an "auto" left unfilled is refused by name
        DeepSpeedPlugin(hf_ds_config=sections).ds_config(
            accumulation_steps=1, mixed_precision="no", micro_batch_size=4, world_size=1
        )
    cfg = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto"}).ds_config(
        accumulation_steps=2, mixed_precision="bf16", micro_batch_size=4, world_size=2
    )
    assert cfg["train_batch_size"] == 16 and cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["gradient_clipping"] == 0.0


def test_deepspeed_and_fsdp_together_are_refused() -> None:
    from notebook_accel.training.accelerator import Accelerator

    # Refused at construction, before any process group work.
    with pytest.raises(ConfigError, match="deepspeed_plugin"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(), fsdp="full")


def _launched() -> tuple[str, int, int]:
    from notebook_accel import Accelerator

    acc = Accelerator()
    model = make_model()
    model, _ = acc.prepare(model, OPT(model.parameters()))
    assert acc.deepspeed_plugin is not None
    return type(model).__name__, acc.deepspeed_plugin.zero_stage, acc.gradient_accumulation_steps


def test_launch_option_reaches_the_workers_accelerator() -> None:
    from notebook_accel import notebook_launcher

    results = notebook_launcher(
        _launched,
        num_processes=2,
        hardware="cpu",
        deepspeed={"zero_stage": 3},
        gradient_accumulation_steps=2,
    )
    assert results == [("DeepSpeedEngine", 3, 2)] * 2


def test_launch_option_is_validated_in_the_notebook() -> None:
    from notebook_accel import notebook_launcher
    from notebook_accel.config import LaunchConfig

    def never() -> None:
        raise AssertionError("no worker may start")

    with pytest.raises(ConfigError, match="deepspeed"):
        notebook_launcher(never, num_processes=2, hardware="cpu", deepspeed="zero2")
    with pytest.raises(ConfigError, match="zero_stage"):
        notebook_launcher(never, num_processes=2, hardware="cpu", deepspeed=5)
    with pytest.raises(ConfigError, match="fsdp"):
        notebook_launcher(never, num_processes=2, hardware="cpu", deepspeed=2, fsdp="full")
    config = LaunchConfig(deepspeed=DeepSpeedPlugin(zero_stage=1, gradient_clipping=1.0))
    assert config.deepspeed == {"zero_stage": 1, "gradient_clipping": 1.0}
    assert config.file_values()["deepspeed"] == {"zero_stage": 1, "gradient_clipping": 1.0}


ACCELERATE_SCRIPT = """
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, set_seed


def main():
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision="no")
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(64, 6)
    y = x @ torch.randn(6, 3)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = [[], []]
    for epoch in range(2):
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses[epoch].append(loss.item())
    accelerator.wait_for_everyone()
    # per epoch: a single batch's loss depends on which samples the shuffle put there
    return sum(losses[0]) / len(losses[0]), sum(losses[1]) / len(losses[1])
"""


def test_an_accelerate_script_runs_with_its_import_changed(tmp_path: Path) -> None:
    from notebook_accel import notebook_launcher

    ported = ACCELERATE_SCRIPT.replace("from accelerate", "from notebook_accel")
    (tmp_path / "ds_script.py").write_text(ported)
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        import ds_script  # type: ignore[import-not-found]

        results = notebook_launcher(ds_script.main, num_processes=2, hardware="cpu")
    finally:
        sys.path.remove(str(tmp_path))
    for first, last in results:
        assert last < first  # it trained


DS_SCRIPT = """
import torch
from notebook_accel import Accelerator

acc = Accelerator()
model = torch.nn.Linear(4, 2)
model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
cfg = model.config  # DeepSpeed's resolved config
print(f"engine={type(model).__name__} stage={acc.deepspeed_plugin.zero_stage} "
      f"clip={cfg['gradient_clipping']} micro={cfg['train_micro_batch_size_per_gpu']}")
"""


def test_cli_launch_use_deepspeed(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "ds.py"
    script.write_text(DS_SCRIPT)
    ds_json = tmp_path / "ds_config.json"
    ds_json.write_text(json.dumps({"gradient_clipping": 0.5, "zero_optimization": {"stage": 1}}))
    args = ["launch", "--num_processes", "2", "--hardware", "cpu", "--use_deepspeed"]
    args += ["--zero_stage", "3", "--deepspeed_config_file", str(ds_json), str(script)]
    done = subprocess.run(
        [sys.executable, "-m", "notebook_accel.faces.cli", *args],
        env=dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "c.json")),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # --zero_stage overrides the file's stage; the file's clipping is kept.
    assert "[rank 1] engine=DeepSpeedEngine stage=3 clip=0.5 micro=1" in done.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "notebook_accel.faces.cli",
            "launch",
            "--zero_stage",
            "7",
            str(script),
        ],
        env=dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "c.json")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--zero_stage=7" in bad.stderr, bad.stderr


def test_panel_offers_deepspeed_and_keeps_the_choice(tmp_path: Path) -> None:
    from notebook_accel import hardware
    from notebook_accel.config import save_file
    from notebook_accel.faces.panel import LaunchPanel

    pytest.importorskip("ipywidgets")
    machine = hardware.detect()
    panel = LaunchPanel(lambda: None, machine=machine)
    assert "zero3" in dict(panel.sharding.options).values()
    panel.sharding.value = "zero3"
    config = panel.launch_config
    assert config.deepspeed == {"zero_stage": 3} and config.fsdp is None
    path = save_file(config, tmp_path / "c.json")
    from notebook_accel.config import load_file

    panel._show(load_file(path))
    assert panel.sharding.value == "zero3"


def _bf16() -> tuple[bool, str, float, float]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = make_model()
    model, opt, loader = acc.prepare(model, OPT(model.parameters()), make_loader())
    losses = []
    for x, y in loader:
        loss = F.mse_loss(model(x).float(), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    dtype = str(next(acc.unwrap_model(model).parameters()).dtype)
    return model.config["bf16"]["enabled"], dtype, sum(losses[:5]) / 5, sum(losses[-5:]) / 5


def test_bf16_goes_through_deepspeeds_config() -> None:
    for enabled, dtype, first, last in debug_launcher(_bf16, num_processes=2):
        assert enabled and dtype == "torch.bfloat16"
        assert last < first


def test_missing_package_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from notebook_accel.config import LaunchConfig

    # find_spec answers None for a module set to None in sys.modules: as if not installed.
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ConfigError, match=r"notebook-accel\[deepspeed\]"):
        LaunchConfig(deepspeed=2)


# ---- accelerate 1.16's plugin fields -------------------------------------------------------
class Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(6, 15)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.up(x))


def _batch_and_moe() -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    out: dict[str, Any] = {}
    train_loader = make_loader()
    eval_loader = DataLoader(train_loader.dataset, batch_size=8)
    for smallest in (True, False):
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(is_train_batch_min=smallest))
        model = make_model()
        model, _, _, _ = acc.prepare(model, OPT(model.parameters()), train_loader, eval_loader)
        out[smallest] = model.train_micro_batch_size_per_gpu()
        acc.end_training()
    plugin = DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Experts")
    acc = Accelerator(deepspeed_plugin=plugin)
    model = torch.nn.Sequential(Experts(), torch.nn.Linear(15, 3))
    model, _ = acc.prepare(model, OPT(model.parameters()))
    out["leaf"] = [getattr(m, "_z3_leaf", False) for m in model.module]
    acc.end_training()
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(transformer_moe_cls_names="Nope"))
    try:
        acc.prepare(make_model())
    except ConfigError as error:
        out["unknown"] = str(error).splitlines()[0]
    return out


def test_accelerate_116_plugin_fields_batch_size_moe_leaves_and_nvme(tmp_path: Path) -> None:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    from notebook_accel.errors import NotProvidedError
    from notebook_accel.training.accelerator import Accelerator

    ((found),) = debug_launcher(_batch_and_moe, num_processes=1)
    assert (found[True], found[False]) == (4, 8)  # train 4, eval 8: the smaller, or larger
    assert found["leaf"] == [True, False]
    assert "transformer_moe_cls_names" in found["unknown"] and "Nope" in found["unknown"]
    nvme = DeepSpeedPlugin(
        zero_stage=3,
        offload_param_device="nvme",
        offload_param_nvme_path=tmp_path,
        offload_optimizer_device="cpu",
        offload_optimizer_nvme_path=tmp_path / "unused",  # not "nvme": not DeepSpeed's
    )
    zero = nvme.deepspeed_config["zero_optimization"]
    assert zero["offload_param"] == {"device": "nvme", "nvme_path": str(tmp_path)}
    assert zero["offload_optimizer"] == {"device": "cpu"}
    if AsyncIOBuilder().is_compatible(verbose=False):
        pytest.skip("this DeepSpeed has its async_io op: NVMe offload is not refused here")
    with pytest.raises(NotProvidedError, match="async_io"):
        Accelerator(deepspeed_plugin=nvme)
