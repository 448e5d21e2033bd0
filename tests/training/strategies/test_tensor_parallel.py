"""Tensor parallelism and mesh sizes through ParallelismConfig on real gloo processes:
TP=2 equals one process, resume through DCP is exact, a TP checkpoint loads on one process,
every TP rank reads the same batches, and bad meshes are refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher
from notebook_accel.errors import ConfigError
from notebook_accel.options.parallelism import ParallelismConfig
from tests.tiny_models import tiny_llama_config

PLAN = {"0": "colwise", "2": "rowwise"}


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def make_loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def train(tp: int, steps: int = 6, folder: str | None = None) -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    config = ParallelismConfig(tp_size=tp, tp_plan=PLAN) if tp > 1 else None
    acc = Accelerator(parallelism_config=config)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    model, opt, loader = acc.prepare(model, opt, make_loader())
    batches = list(loader)

    def run(start: int, n: int) -> list[float]:
        losses = []
        for x, y in batches[start : start + n]:
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    if folder is None:
        losses = run(0, steps)
    else:
        run(0, steps // 2)
        acc.save_state(folder)
        losses = run(steps // 2, steps // 2)
        acc.load_state(folder)
        assert run(steps // 2, steps // 2) == losses
    return {
        "weights": acc.get_state_dict(model),
        "losses": losses,
        "first_batch": batches[0][0].sum().item(),
        "batches": len(batches),
    }


def _load_on_one(folder: str) -> dict[str, torch.Tensor]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, _ = acc.prepare(model, opt, make_loader())
    acc.load_state(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_tp2_equals_one_process_and_resumes(tmp_path: Path) -> None:
    (one,) = debug_launcher(train, (1,), num_processes=1)
    results = debug_launcher(train, (2,), num_processes=2)
    for rank in results:
        # Both TP ranks read every batch (the data-parallel size is 1).
        assert rank["batches"] == one["batches"] == 12
        assert rank["first_batch"] == one["first_batch"]
        torch.testing.assert_close(rank["losses"], one["losses"], atol=1e-5, rtol=1e-5)
        for key, ref in one["weights"].items():
            torch.testing.assert_close(rank["weights"][key], ref, atol=1e-5, rtol=1e-5)
    folder = str(tmp_path / "ckpt")
    resumed = debug_launcher(train, (2, 6, folder), num_processes=2)
    assert (tmp_path / "ckpt" / "sharded" / ".metadata").is_file()
    (loaded,) = debug_launcher(_load_on_one, (folder,), num_processes=1)
    # The TP=2 checkpoint (taken after 3 steps) loads whole into a plain model.
    assert set(loaded) == set(resumed[0]["weights"])
    assert all(v.shape == resumed[0]["weights"][k].shape for k, v in loaded.items())


def test_bad_meshes_are_refused() -> None:
    with pytest.raises(ConfigError, match="cp_size"):
        ParallelismConfig(cp_size=2)
    with pytest.raises(ConfigError, match="tp_plan"):
        ParallelismConfig(tp_size=2, tp_plan={"0": "diagonal"})
    with pytest.raises(ConfigError, match="parallelism_config"):
        ParallelismConfig(tp_size=3).check(2)
    ParallelismConfig(dp_replicate_size=2, tp_size=2).check(4)  # TP with replicas: built


def _mesh_strategy(replicate: int, shard: int) -> tuple[str, tuple[int, ...], int, int]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(
        parallelism_config=ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard)
    )
    model = acc.prepare(torch.nn.Linear(8, 8, bias=False))
    strategy = acc._strategy
    local = sum(p.to_local().numel() for p in model.parameters())
    return strategy.name, tuple(strategy.sharder.mesh.shape), local, strategy.data_size


def test_hsdp_from_the_mesh_sizes_is_fsdp_hybrid() -> None:
    # dp_replicate=2 x dp_shard=2: the same hybrid mesh as fsdp="hybrid" with groups of 2.
    results = debug_launcher(_mesh_strategy, (2, 2), num_processes=4)
    assert {r[:2] for r in results} == {("fsdp", (2, 2))}
    assert all(r[2] == 32 and r[3] == 4 for r in results)  # 64 weights cut in 2 shards


def _launched_mesh() -> tuple[str, int]:
    from notebook_accel import Accelerator

    acc = Accelerator()
    acc.prepare(make_model())
    return acc._strategy.name, acc._strategy.data_size


def test_launch_option_reaches_the_workers_and_is_checked_first() -> None:
    from notebook_accel import notebook_launcher

    results = notebook_launcher(
        _launched_mesh,
        num_processes=2,
        hardware="cpu",
        parallelism_config={"tp_size": 2, "tp_plan": PLAN},
    )
    assert results == [("tp", 1)] * 2

    def never() -> None:
        raise AssertionError("no worker may start")

    # tp_size not dividing the processes, and FSDP said twice: refused in the notebook.
    with pytest.raises(ConfigError, match="parallelism_config"):
        notebook_launcher(never, num_processes=2, hardware="cpu", parallelism_config={"tp_size": 3})
    with pytest.raises(ConfigError, match="parallelism_config"):
        notebook_launcher(
            never,
            num_processes=2,
            hardware="cpu",
            parallelism_config={"dp_shard_size": 2},
            fsdp="full",
        )


def _two_d(shard: int, tp: int, replicate: int = 1) -> dict[str, torch.Tensor]:
    from notebook_accel.training.accelerator import Accelerator

    mesh = None
    if tp > 1:
        mesh = ParallelismConfig(
            dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, tp_plan=PLAN
        )
    # Global batches of 8 cut across the data-parallel ranks: one process takes all 8.
    acc = Accelerator(parallelism_config=mesh, split_batches=True)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    loader = DataLoader(make_loader().dataset, batch_size=8)
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in list(loader)[:4]:
        acc.backward(F.mse_loss(model(x), y))
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return acc.get_state_dict(model)


def test_dp_shard2_x_tp2_on_four_processes_equals_one_process() -> None:
    (one,) = debug_launcher(_two_d, (1, 1), num_processes=1)
    results = debug_launcher(_two_d, (2, 2), num_processes=4)
    for key, ref in one.items():
        torch.testing.assert_close(results[0][key], ref, atol=1e-5, rtol=1e-5)


def test_dp_replicate2_x_tp2_on_four_processes_equals_one_process() -> None:
    # TP slices replicated across 2 data-parallel ranks (HSDP with shards of 1: gradients
    # all-reduced over the replicas), each replica reading half of every global batch.
    (one,) = debug_launcher(_two_d, (1, 1), num_processes=1)
    results = debug_launcher(_two_d, (1, 2, 2), num_processes=4)
    for key, ref in one.items():
        torch.testing.assert_close(results[0][key], ref, atol=1e-5, rtol=1e-5)


def _llama(tp: int) -> list[float]:
    from transformers import LlamaForCausalLM

    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=tp) if tp > 1 else None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)  # no tp_plan: the model's base_model_tp_plan
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def test_transformers_base_model_tp_plan_equals_one_process() -> None:
    pytest.importorskip("transformers")
    (one,) = debug_launcher(_llama, (1,), num_processes=1)
    for losses in debug_launcher(_llama, (2,), num_processes=2):
        torch.testing.assert_close(losses, one, atol=1e-5, rtol=1e-5)
