"""Tiny models built from configs (nothing downloaded), shared by the tests that need them."""

from __future__ import annotations

from typing import Any


def tiny_llama_config() -> Any:
    """A one-layer Llama config (vocabulary 32, hidden 16, grouped-query attention 4/2).

    Small enough to train in milliseconds, with every part a real model has: embeddings,
    attention with its own TP plan (``base_model_tp_plan``), MLP, norms and an LM head.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
