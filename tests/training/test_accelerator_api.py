"""The Accelerator in a plain single process: bad input, properties, sharding arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import env, launched
from notebook_accel.config import LaunchConfig
from notebook_accel.errors import ConfigError
from notebook_accel.training.accelerator import Accelerator, DistributedType
from notebook_accel.training.data.loader import ShardSampler, plan_rounds


@pytest.mark.parametrize("value", ["fp32", "FP16", 16, ""])
def test_wrong_mixed_precision_names_the_argument(value: object) -> None:
    with pytest.raises(ConfigError, match="mixed_precision") as err:
        Accelerator(mixed_precision=value)  # type: ignore[arg-type]
    assert err.value.parameter == "mixed_precision" and err.value.value == value
    assert "'bf16'" in err.value.accepted


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_accumulation_steps_below_one(value: object) -> None:
    with pytest.raises(ConfigError, match="gradient_accumulation_steps") as err:
        Accelerator(gradient_accumulation_steps=value)  # type: ignore[arg-type]
    assert err.value.accepted == "an int >= 1"


def test_prepare_of_an_unsupported_object() -> None:
    acc = Accelerator()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=r"prepare\(\) argument 2") as err:
        acc.prepare(model, {"not": "supported"})
    assert err.value.value == "dict" and "torch.nn.Module" in err.value.accepted
    assert acc._objects.model == []  # nothing half-prepared


def test_split_batches_needs_a_divisible_batch_size() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=3)
    with env.overridden({"RANK": "0", "WORLD_SIZE": "2"}):
        from notebook_accel.training.data.sharding import shard_data_loader
        from notebook_accel.training.process import GradientState, ProcessState

        state = ProcessState(0, 0, 2, 2, torch.device("cpu"), "gloo", DistributedType.MULTI_CPU)
        with pytest.raises(ConfigError, match="split_batches"):
            shard_data_loader(loader, state, GradientState(), 0, split_batches=True)


def test_single_process_defaults() -> None:
    acc = Accelerator()
    assert (acc.num_processes, acc.process_index, acc.local_process_index) == (1, 0, 0)
    assert acc.is_main_process and acc.is_local_main_process
    assert acc.distributed_type == DistributedType.NO == "NO"
    assert acc.device == torch.device("cpu") and acc.mixed_precision == "no"
    assert acc.sync_gradients and acc.gradient_accumulation_steps == 1
    assert not acc.optimizer_step_was_skipped and acc.scaler is None


def test_launch_options_are_the_defaults() -> None:
    options = LaunchConfig(mixed_precision="bf16", gradient_accumulation_steps=3)
    launched.become_rank(launched.Launch(options))  # as a rank of such a launch
    try:
        acc = Accelerator()
        explicit = Accelerator(mixed_precision="no", gradient_accumulation_steps=1)
    finally:
        launched.become_rank(None)
    assert (acc.mixed_precision, acc.gradient_accumulation_steps) == ("bf16", 3)
    assert (explicit.mixed_precision, explicit.gradient_accumulation_steps) == ("no", 1)


def test_one_process_loader_matches_the_plain_loader() -> None:
    data = TensorDataset(torch.arange(10))
    acc = Accelerator()
    ours = [b.tolist() for (b,) in acc.prepare(DataLoader(data, batch_size=4))]
    assert ours == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # no padding with one process


@pytest.mark.parametrize(
    ("split", "size", "expected", "remainder"),
    [
        (False, 2, [[[0, 1], [2, 3]], [[4, 5], [6, 0]]], 3),  # 7 samples, 2 ranks, batch 2
        (True, 4, [[[0, 1], [2, 3]], [[4, 5], [6, 0]]], 3),  # the same with global batch 4
        (False, 1, [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [0]]], 1),
    ],
)
def test_shard_rounds(split: bool, size: int, expected: list, remainder: int) -> None:
    batches = list(torch.utils.data.BatchSampler(range(7), size, drop_last=False))
    assert plan_rounds(batches, 2, size, split, even_batches=True) == (expected, remainder)
    sampler = ShardSampler(batches, 2, 1, size, split, even_batches=True)
    assert list(sampler) == [r[1] for r in expected]
    assert len(sampler) == len(expected)


def test_unwrap_and_state_dict_and_save_model(tmp_path: object) -> None:
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(torch.nn.Linear(3, 2))
    assert model(torch.ones(1, 3)).dtype == torch.float32
    assert set(acc.get_state_dict(model)) == {"weight", "bias"}
    path = acc.save_model(model, tmp_path)  # type: ignore[arg-type]
    from safetensors.torch import load_file

    assert path.name == "model.safetensors"
    assert set(load_file(path)) == {"weight", "bias"}
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    with acc.autocast():
        assert plain(torch.ones(1, 3)).dtype == torch.bfloat16


def test_register_for_checkpointing_checks_the_object() -> None:
    with pytest.raises(ConfigError, match=r"register_for_checkpointing\(\) argument 1"):
        Accelerator().register_for_checkpointing(object())


def test_scheduler_steps_once_per_optimizer_step() -> None:
    acc = Accelerator(gradient_accumulation_steps=2)
    model = acc.prepare(torch.nn.Linear(2, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=1.0))
    # made from the prepared optimizer, as some accelerate scripts do
    sched = acc.prepare(torch.optim.lr_scheduler.StepLR(opt, 1, 0.5))
    before = model.weight.detach().clone()
    for i in range(4):
        with acc.accumulate(model):
            acc.backward(model(torch.ones(1, 2)).sum())
            opt.step()
            sched.step()
            opt.zero_grad()
            if i == 0:  # mid-accumulation: no step, gradients kept
                assert torch.equal(model.weight, before) and model.weight.grad is not None
    assert sched.get_last_lr() == [0.25] and acc.step == 4
