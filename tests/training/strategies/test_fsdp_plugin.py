"""FullyShardedDataParallelPlugin: accelerate's fields mapped onto FsdpConfig, the others
refused, and ``Accelerator(fsdp_plugin=...)`` sharding for real on 2 processes (gloo)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import (
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)

from notebook_accel import FsdpConfig, FullyShardedDataParallelPlugin, debug_launcher
from notebook_accel.errors import ConfigError


def test_accelerate_fields_map_onto_fsdp_config() -> None:
    plugin = FullyShardedDataParallelPlugin
    assert plugin() == FsdpConfig()
    assert plugin(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP).sharding_strategy == "grad_op"
    assert plugin(sharding_strategy="hybrid_shard").sharding_strategy == "hybrid"
    assert plugin(sharding_strategy=3).sharding_strategy == "no_shard"
    assert plugin(fsdp_version=2, reshard_after_forward=False).sharding_strategy == "grad_op"
    assert plugin(reshard_after_forward=True) == FsdpConfig()
    wrap = plugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["B"])
    assert wrap.auto_wrap_classes == ("B",)
    assert plugin(auto_wrap_policy="size_based_wrap", min_num_params=500).min_num_params == 500
    assert plugin(cpu_offload=CPUOffload(offload_params=True)).cpu_offload
    assert not plugin(cpu_offload=CPUOffload(offload_params=False)).cpu_offload
    for policy in (
        "bf16",
        {"param_dtype": torch.bfloat16, "reduce_dtype": torch.bfloat16},
        MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
    ):
        config = plugin(mixed_precision_policy=policy)
        assert (config.param_dtype, config.reduce_dtype) == ("bf16", "bf16"), policy
    assert not plugin(sync_module_states=False).sync_module_states
    # fsdp_with_peak_mem_tracking.py's call
    made = plugin(
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False),
        state_dict_type="FULL_STATE_DICT",
    )
    assert made == FsdpConfig()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fsdp_version", 1),
        ("backward_prefetch", "BACKWARD_PRE"),
        ("forward_prefetch", True),
        ("use_orig_params", False),
        ("limit_all_gathers", False),
        ("cpu_ram_efficient_loading", True),
        ("param_init_fn", lambda m: None),
        ("auto_wrap_policy", lambda *a: True),
        ("auto_wrap_policy", "layer_wrap"),
        ("sharding_strategy", "_HYBRID_SHARD_ZERO2"),
        ("mixed_precision_policy", "fp8"),
        ("state_dict_type", "WHOLE"),
        ("state_dict_config", {"rank0_only": True}),
    ],
)
def test_fields_without_a_counterpart_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"FullyShardedDataParallelPlugin\({field}\)"):
        FullyShardedDataParallelPlugin(**{field: value})


def test_activation_checkpointing_is_the_wrapped_units_and_offload_needs_it() -> None:
    wrap = {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["B"]}
    config = FullyShardedDataParallelPlugin(
        activation_checkpointing=True, activation_checkpointing_offload=True, **wrap
    )
    assert (config.activation_checkpointing, config.activation_checkpointing_offload) == (
        True,
        True,
    )
    with pytest.raises(ConfigError, match="activation_checkpointing=True"):  # accelerate's rule
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True, **wrap)
    with pytest.raises(ConfigError, match="auto_wrap_classes or min_num_params"):
        FullyShardedDataParallelPlugin(activation_checkpointing=True)  # no unit to checkpoint


def test_wrap_policies_need_their_parameter() -> None:
    with pytest.raises(ConfigError, match="transformer_cls_names_to_wrap"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    with pytest.raises(ConfigError, match="min_num_params"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap")


def test_accelerator_takes_one_of_fsdp_and_fsdp_plugin() -> None:
    from notebook_accel import Accelerator

    with pytest.raises(ConfigError, match="fsdp_plugin"):
        Accelerator(fsdp="full", fsdp_plugin=FsdpConfig())
    with pytest.raises(ConfigError, match="fsdp_plugin"):
        Accelerator(fsdp_plugin={"sharding_strategy": "full"})  # type: ignore[arg-type]


def _train(use_plugin: bool) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from notebook_accel import Accelerator

    if use_plugin:
        acc = Accelerator(
            fsdp_plugin=FullyShardedDataParallelPlugin(
                state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                optim_state_dict_config=FullOptimStateDictConfig(
                    offload_to_cpu=False, rank0_only=False
                ),
            )
        )
    else:
        acc = Accelerator(fsdp=FsdpConfig())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    sharded = isinstance(next(model.parameters()), DTensor)
    g = torch.Generator().manual_seed(acc.process_index)
    for _ in range(3):
        x, y = torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    weights = [p.full_tensor().detach().clone() for p in model.parameters()]
    return {"sharded": sharded, "weights": weights}


def _both() -> dict[str, Any]:
    return {"plugin": _train(True), "config": _train(False)}


def test_fsdp_plugin_shards_as_fsdp_config_does_on_two_processes() -> None:
    for result in debug_launcher(_both, num_processes=2):
        assert result["plugin"]["sharded"] and result["config"]["sharded"]
        for a, b in zip(result["plugin"]["weights"], result["config"]["weights"], strict=True):
            assert torch.equal(a, b)
