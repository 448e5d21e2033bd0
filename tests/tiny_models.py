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


# -- Hugging Face trainers on tiny models, offline (launched from notebooks by the tests) ------

_WORDS = [f"w{i}" for i in range(20)]


def word_tokenizer(kind: str) -> Any:
    """A word-level tokenizer over w0..w19, built here: BERT's specials and its [CLS] ... [SEP]
    template (``kind="bert"``), or a causal LM's (<pad>, <unk>, <s>, </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    bert = kind == "bert"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] if bert else ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials + _WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=specials[1]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if not bert:
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            pad_token="<pad>",
            unk_token="<unk>",
            bos_token="<s>",
            eos_token="</s>",
        )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )


def sentences(count: int, words: int, seed: int = 0) -> list[str]:
    """``count`` random sentences of ``words`` words of the tokenizers' vocabulary."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(words)) for _ in range(count)]


def _keep(folder: str | None, value: float) -> float:
    """The rank's number in ``folder`` (one file per rank): accelerate's launcher returns
    nothing, so its runs are compared through these files."""
    import json
    import os

    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, os.environ.get("RANK", "0")), "w") as out:
            json.dump(value, out)
    return value


def trainer_run(folder: str | None = None, with_datasets: bool = True) -> float:
    """transformers' Trainer: a tiny BERT learns whether w7 occurs (64 sentences, 2 epochs of
    8 steps on 2 processes, a loss row every 2 steps). The data is a ``datasets.Dataset``
    (tokenized by its ``map``), or plain dicts without datasets. Returns the training loss."""
    from transformers import Trainer, TrainingArguments

    tokenizer = word_tokenizer("bert")
    rows = sentences(64, 8)
    labels = [int("w7" in row.split()) for row in rows]
    encoded = tokenizer(rows, padding="max_length", max_length=12)
    data: Any = [
        {"input_ids": ids, "attention_mask": mask, "labels": label}
        for ids, mask, label in zip(
            encoded["input_ids"], encoded["attention_mask"], labels, strict=True
        )
    ]
    if with_datasets:
        from datasets import Dataset

        data = Dataset.from_dict({"text": rows, "label": labels}).map(
            lambda b: tokenizer(b["text"], padding="max_length", max_length=12), batched=True
        )
    arguments = _arguments(TrainingArguments, folder)
    trainer = Trainer(model=tiny_bert(len(tokenizer)), args=arguments, train_dataset=data)
    return _keep(folder, round(trainer.train().training_loss, 6))


def sft_run(folder: str | None = None) -> float:
    """TRL's SFTTrainer with a PEFT LoRA (rank 4 on q/v) on a tiny Llama, 64 sentences
    (datasets' map bars: adding EOS, tokenizing, ...). Returns the training loss."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    tokenizer = word_tokenizer("llama")
    config = tiny_llama_config()  # its vocabulary (32) holds the tokenizer's 24
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 2, 3
    torch.manual_seed(0)
    trainer = SFTTrainer(
        model=LlamaForCausalLM(config),
        args=_arguments(SFTConfig, folder, max_length=16),
        train_dataset=Dataset.from_dict({"text": sentences(64, 10)}),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        ),
    )
    return _keep(folder, round(trainer.train().training_loss, 6))


def tiny_bert(vocab_size: int) -> Any:
    """A two-layer BERT classifier (hidden 32, two labels), drawn from torch's seed 0."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def _arguments(kind: Any, folder: str | None, **extra: Any) -> Any:
    """A trainer's arguments (TrainingArguments, SFTConfig): 2 epochs of batches of 8 on CPU,
    a loss row every 2 steps, seed 0, nothing saved or reported."""
    import os
    import tempfile

    return kind(
        output_dir=os.path.join(folder, "out") if folder is not None else tempfile.mkdtemp(),
        per_device_train_batch_size=8,
        num_train_epochs=2,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        **extra,
    )


def accelerator_loop(folder: str | None = None) -> float:
    """accelerate's ``Accelerator`` (bf16, gradient accumulation 2) on a tiny BERT, with the
    ``tqdm.auto`` bar of Hugging Face's notebook examples (simple_nlp_example's loop, on the
    main process). Returns the last loss."""
    import torch
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
    tokenizer = word_tokenizer("bert")
    rows = sentences(64, 8)
    encoded = tokenizer(rows, padding="max_length", max_length=12, return_tensors="pt")
    labels = torch.tensor([int("w7" in row.split()) for row in rows])
    data = torch.utils.data.TensorDataset(encoded["input_ids"], labels)
    model = tiny_bert(len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    bar = tqdm(range(2 * len(loader)), disable=not accelerator.is_main_process)
    loss = torch.tensor(0.0)
    for _ in range(2):
        for ids, target in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=target).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            bar.update(1)
    return _keep(folder, round(float(accelerator.gather(loss.detach()).mean()), 6))


def nothing(folder: str | None = None) -> None:
    """Returns nothing (a launch's own cost; a cell that shows nothing for its value)."""
    _keep(folder, 0.0)
