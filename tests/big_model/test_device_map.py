"""infer_auto_device_map and get_balanced_memory give accelerate 1.16's answers for the same
model and budgets: a GPT-2 and a BERT built from tiny configs, blocks on GPU ids, on the CPU
and on disk (accelerate computes maps for GPU ids without a GPU; both run here)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

from notebook_accel.big_modeling import init_empty_weights
from notebook_accel.errors import ConfigError
from notebook_accel.utils import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=6, n_head=2)
    with init_empty_weights():
        return GPT2LMHeadModel(config)  # lm_head tied to transformer.wte


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=32, hidden_size=32, num_hidden_layers=6, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16,
    )  # fmt: skip
    with init_empty_weights():
        return BertForMaskedLM(config)  # decoder tied to the word embeddings


MODELS = {"gpt2": (gpt2, "GPT2Block"), "bert": (bert, "BertLayer")}

# Shares of the model's size: (GPU 0, GPU 1, CPU); what is left goes to disk.
SHARES = [
    (0.35, 0.25, 0.45),
    (0.35, 0.25, 0.5),
    (0.3, 0.3, 0.25),
    (0.5, 0.2, 0.1),
    (0.15, 0.15, 0.15),
    (0.6, 0.0, 0.2),
    (0.05, 0.4, 0.3),
    (1.2, 0.5, 0.5),
    (0.2, 0.1, 0.3),  # with fallback_allocation, the CPU gets a later module
    (0.1, 0.05, 0.3),
]


def budgets(model: nn.Module, shares: tuple[float, ...]) -> dict[int | str, int]:
    total = compute_module_sizes(model)[""]
    gpu0, gpu1, cpu = (int(share * total) for share in shares)
    found: dict[int | str, int] = {0: gpu0, "cpu": cpu}
    if gpu1:
        found[1] = gpu1
    return found


def places(device_map: dict[str, Any]) -> set[Any]:
    return set(device_map.values())


@pytest.mark.parametrize(
    ("name", "shares", "split", "dtype"),
    list(itertools.product(MODELS, SHARES, [True, False], [None, torch.float16])),
)
@pytest.mark.parametrize("fallback", [False, True])
def test_the_map_is_accelerates(
    name: str, shares: tuple[float, ...], split: bool, dtype: torch.dtype | None, fallback: bool
) -> None:
    from accelerate.utils import infer_auto_device_map as theirs

    build, block = MODELS[name]
    model = build()
    memory = budgets(model, shares)
    no_split = [block] if split else None
    options: dict[str, Any] = {"dtype": dtype, "fallback_allocation": fallback}
    ours = infer_auto_device_map(model, dict(memory), no_split, **options)
    expected = theirs(model, dict(memory), no_split, **options)
    assert ours == dict(expected)


def test_fallback_allocation_fills_a_device_the_next_block_does_not_fit() -> None:
    model = gpt2()
    memory = budgets(model, (0.2, 0.1, 0.3))
    plain = infer_auto_device_map(model, dict(memory), ["GPT2Block"])
    filled = infer_auto_device_map(model, dict(memory), ["GPT2Block"], fallback_allocation=True)
    assert "cpu" not in plain.values() and "cpu" in filled.values()


@pytest.mark.parametrize("name", MODELS)
def test_one_map_per_model_reaches_gpus_cpu_and_disk(name: str) -> None:
    build, block = MODELS[name]
    model = build()
    device_map = infer_auto_device_map(model, budgets(model, (0.35, 0.25, 0.45)), [block])
    assert places(device_map) == {0, 1, "cpu", "disk"}


@pytest.mark.parametrize(
    ("name", "low_zero", "ids"),
    [
        *[(m, z, (0, 1, 2)) for m, z in itertools.product(MODELS, [False, True])],
        # GPU ids that are not 0..n-1: accelerate 1.16 fixed low_zero's sum over them
        *[(m, True, (0, 2, 3)) for m in MODELS],
    ],
)
def test_balanced_budgets_and_their_maps_are_accelerates(
    name: str, low_zero: bool, ids: tuple[int, int, int]
) -> None:
    from accelerate.utils import get_balanced_memory as their_budgets
    from accelerate.utils import infer_auto_device_map as theirs

    build, block = MODELS[name]
    model = build()
    total = compute_module_sizes(model)[""]
    first, second, third = ids
    memory: dict[int | str, int] = {
        first: total,
        second: total,
        third: total // 4,
        "cpu": total // 5,
    }
    ours = get_balanced_memory(model, dict(memory), [block], low_zero=low_zero)
    expected = their_budgets(model, dict(memory), [block], low_zero=low_zero)
    assert ours == expected
    assert infer_auto_device_map(model, ours, [block]) == dict(theirs(model, expected, [block]))


def test_sizes_read_as_accelerate_reads_them() -> None:
    from accelerate.utils import get_max_memory as theirs

    memory = {"cpu": "1GB", "disk": "2GiB", 1: "10MB", 0: 5, "mps": "1KiB"}
    assert get_max_memory(dict(memory)) == theirs(dict(memory))
    assert list(get_max_memory(dict(memory))) == [0, 1, "mps", "cpu", "disk"]


def test_an_unknown_device_or_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_memory"):
        get_max_memory({"tpu": 10})
    with pytest.raises(ConfigError, match="size"):
        get_max_memory({"cpu": "ten gigabytes"})


def test_without_budgets_the_machines_memory_is_read_as_accelerate_reads_it() -> None:
    from accelerate.utils import infer_auto_device_map as theirs

    model = gpt2()
    assert infer_auto_device_map(model) == dict(theirs(model)) == {"": "cpu"}
    assert list(get_max_memory()) == ["cpu"]
