"""Tiny GPT-2 and BERT models from configs (nothing downloaded), and their checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


def gpt2_config(layers: int = 6, width: int = 32) -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=64, n_positions=16, n_embd=width, n_layer=layers, n_head=2)


def bert_config(layers: int = 6, width: int = 32) -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=64, hidden_size=width, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * width, max_position_embeddings=16,
    )  # fmt: skip


def build(kind: str, config: Any) -> nn.Module:
    from transformers import BertForMaskedLM, GPT2LMHeadModel

    model = {"gpt2": GPT2LMHeadModel, "bert": BertForMaskedLM}[kind](config)
    return model.eval()


def empty(kind: str, config: Any) -> nn.Module:
    """The model built on the meta device, its tied weights tied (outside the context: in it
    every assignment of a parameter registers a new meta one, as in accelerate)."""
    from notebook_accel.big_modeling import init_empty_weights

    with init_empty_weights():
        model = build(kind, config)
    model.tie_weights()
    return model


BLOCKS = {"gpt2": "GPT2Block", "bert": "BertLayer"}


def saved(kind: str, folder: Path, shard: str = "20KB", **sizes: int) -> tuple[Any, Path]:
    """A seeded model saved in shards with an index, and its config."""
    config = (gpt2_config if kind == "gpt2" else bert_config)(**sizes)
    torch.manual_seed(0)
    build(kind, config).save_pretrained(folder, max_shard_size=shard)
    return config, folder


def logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits
